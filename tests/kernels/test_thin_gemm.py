"""kernels/thin_gemm.py: OpenBLAS's large-product SGEMM arithmetic, element by element, for any shape."""
import numpy
import pytest
from threadpoolctl import threadpool_limits

from layerforge.kernels import blas, thin_gemm


def test_the_summed_axis_is_cut_as_openblas_cuts_it():
    assert thin_gemm.k_blocks(448, True) == [(0, 448)]
    assert thin_gemm.k_blocks(1000, False) == [(0, 448), (448, 736), (736, 1000)]  # 552 -> 276 rounded up to 16
    assert thin_gemm.k_blocks(1000, True) == [(0, 448), (448, 724), (724, 1000)]  # 552 -> (552 + 1) // 2
    assert thin_gemm.k_blocks(9216, True)[-2:] == [(8512, 8864), (8864, 9216)]


def test_thin_products_are_the_ones_openblas_computes_otherwise():
    assert thin_gemm.is_thin(1, 4096, 9216) and thin_gemm.is_thin(4096, 1, 9216) and thin_gemm.is_thin(100, 100, 100)
    assert not thin_gemm.is_thin(101, 100, 100)


@pytest.mark.skipif(not blas.canonical_blas(), reason="numpy's BLAS is not OpenBLAS's SkylakeX SGEMM")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, n, k", [(64, 70, 600), (7, 300, 1000), (2, 1000, 4096), (40, 33, 2001), (5, 1400, 147)])
def test_elements_equal_openblas_large_path_bit_for_bit(threads, m, n, k):
    rs = numpy.random.RandomState(m + n + k)
    a, b = rs.randn(m, k).astype(numpy.float32), rs.randn(k, n).astype(numpy.float32)
    with threadpool_limits(threads, user_api="blas"):
        for rhs in (b, numpy.ascontiguousarray(b.T).T):
            numpy.testing.assert_array_equal(thin_gemm.matmul(a, rhs, threaded=threads > 1), a @ rhs)
            numpy.testing.assert_array_equal(thin_gemm.matmul(a[:1], rhs, threaded=threads > 1), (a @ rhs)[:1])


def test_batched_and_broadcast_operands_and_out():
    rs = numpy.random.RandomState(0)
    a, b = rs.randn(3, 4, 50).astype(numpy.float32), rs.randn(50, 9).astype(numpy.float32)
    out = numpy.empty((3, 4, 9), numpy.float32)
    assert thin_gemm.matmul(a, b, out) is out
    numpy.testing.assert_allclose(out, a.astype(numpy.float64) @ b, rtol=1e-5, atol=1e-4)
    numpy.testing.assert_array_equal(out[1], thin_gemm.matmul(a[1], b))
    numpy.testing.assert_array_equal(thin_gemm.matmul(a[:, :, :0], b[:0]), numpy.zeros((3, 4, 9), numpy.float32))


@pytest.mark.skipif(not blas.canonical_blas(), reason="numpy's BLAS is not OpenBLAS's SkylakeX SGEMM")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("images, m, k, n", [(1, 20, 25, 576), (10, 20, 25, 576), (3, 50, 500, 36), (5, 2, 300, 90),
                                             (4, 16, 1000, 20)])
def test_a_convolution_s_products_one_per_image_equal_each_alone(threads, images, m, k, n):
    # a group's filters (M, K) broadcast over the images' columns (images, 1, K, N), plain and transposed (the data
    # gradient's W^T): every image's product is OpenBLAS's large path's for that image alone
    rs = numpy.random.RandomState(images + m + n)
    w, cols = rs.randn(1, m, k).astype(numpy.float32), rs.randn(images, 1, k, n).astype(numpy.float32)
    with threadpool_limits(threads, user_api="blas"):
        for weights in (w, numpy.ascontiguousarray(w.transpose(0, 2, 1)).transpose(0, 2, 1)):
            out = numpy.full((images, 1, m, n), numpy.nan, numpy.float32)
            assert thin_gemm.matmul(weights, cols, out, threaded=threads > 1) is out
            for i in range(images):
                alone = (numpy.ascontiguousarray(weights[0]) @ numpy.pad(cols[i, 0], ((0, 0), (0, 2000))))[:, :n]
                numpy.testing.assert_array_equal(out[i, 0], alone)  # OpenBLAS's large path: columns padded


@pytest.mark.parametrize("out_dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("m, k, n", [(20, 25, 576), (3, 7, 5), (1, 500, 10)])
def test_one_image_s_product_into_out_as_the_matrices_alone(m, k, n, out_dtype):
    # (1, M, K) x (1, K, N) into a given (1, M, N), IM2COL's product at batch 1 (its own short path): the 2-D
    # product's values in the given array, whatever its dtype
    rs = numpy.random.RandomState(m + k + n)
    a, b = rs.randn(1, m, k).astype(numpy.float32), rs.randn(1, k, n).astype(numpy.float32)
    out = numpy.full((1, m, n), numpy.nan, out_dtype)
    assert thin_gemm.matmul(a, b, out) is out
    numpy.testing.assert_array_equal(out[0], thin_gemm.matmul(a[0], b[0]))
    numpy.testing.assert_allclose(out[0], a[0].astype(numpy.float64) @ b[0], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("shape_a, shape_b, layout", [
    ((2, 700), (700, 3000), "b"),  # a few rows: the stream kernel over columns
    ((9, 800), (800, 500), "bt"),  # x @ W.T: groups of 16 rows of W
    ((9, 300), (300, 1000), "b"),  # 64 columns at a time, then 16, then 8 from a padded copy
    ((50, 500), (500, 64), "b"),  # one group of 64 columns: runs of rows (LeNet's second convolution at batch 1)
    ((6, 20, 25), (25, 500), "b"),  # one small product per image, a broadcast over them
    ((20, 25), (6, 25, 500), "b"),
    ((1, 20, 25), (7, 1, 25, 500), "b")])  # a convolution's filters times its images' columns (IMPLICIT's forward)
def test_products_shared_with_product_threads_equal_one_thread(monkeypatch, threads, shape_a, shape_b, layout):
    """A product shared between the kernel threads is handed to product threads as jobs (threadpool.run_jobs); each
    element is computed alone, so the bits equal one thread's."""
    from layerforge.kernels import threadpool

    monkeypatch.setattr(thin_gemm, "PARALLEL_MULTIPLY_ADDS", 0)
    monkeypatch.setattr(thin_gemm, "PARALLEL_MULTIPLY_ADDS_FEW_ROWS", 0)
    rs = numpy.random.RandomState(len(shape_a) + shape_b[-1])
    a = rs.randn(*shape_a).astype(numpy.float32)
    b = rs.randn(*shape_b).astype(numpy.float32)
    if layout == "bt":
        b = numpy.ascontiguousarray(b.T).T
    try:
        threadpool.set_num_threads(1)
        alone = thin_gemm.matmul(a, b, threaded=False)
        threadpool.set_num_threads(threads)
        for _ in range(3):
            numpy.testing.assert_array_equal(thin_gemm.matmul(a, b, threaded=False), alone)
            out = numpy.full(alone.shape, numpy.nan, numpy.float32)
            assert thin_gemm.matmul(a, b, out, threaded=False) is out
            numpy.testing.assert_array_equal(out, alone)
        assert len(threadpool._products["threads"]) >= threads - 1
    finally:
        threadpool.set_num_threads(None)
    numpy.testing.assert_allclose(alone, numpy.matmul(a.astype(numpy.float64), b), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("vectors, rows", [(4, 4), (1, 4), (4, 1), (1, 1)])
def test_the_chains_are_the_same_bits_in_vectors_of_8_and_of_16(vectors, rows):
    """chain_nn as compiled for AVX2 (vectors of 8, the 64 columns in passes of 12 chains) and for AVX-512 (16): each
    element is one FMA chain over a block of k either way, added to c for a later block (both compiled here: a CPU
    compiles either, the one that is not its own slower)."""
    import numba

    from layerforge.kernels import _thin_jit

    columns, k = 16 * vectors, 300
    rs = numpy.random.RandomState(vectors * 10 + rows)
    a, b = rs.randn(rows, k).astype(numpy.float32), rs.randn(k, columns + 5).astype(numpy.float32)
    results = {}
    for lanes in (8, 16):
        chain = _thin_jit._chain_nn(vectors, rows, lanes)

        @numba.njit
        def run(a, b, c):
            chain(a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1], 0, 120, c.ctypes.data, c.shape[1], 0)
            chain(a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1], 120, 180, c.ctypes.data, c.shape[1], 1)
        c = numpy.full((rows, columns + 3), 7.0, numpy.float32)
        run(a, b, c)
        results[lanes] = c
    numpy.testing.assert_array_equal(results[8], results[16])
    numpy.testing.assert_array_equal(results[8][:, columns:], 7.0)  # nothing written past the chains' columns
    exact = a.astype(numpy.float64) @ b[:, :columns].astype(numpy.float64)
    numpy.testing.assert_allclose(results[8][:, :columns], exact, rtol=1e-4, atol=1e-3)
    assert _thin_jit.LANES in (8, 16)


@pytest.mark.parametrize("m, k, n", [(9, 1000, 700), (64, 64, 3000), (5, 2001, 320), (256, 2304, 1000),
                                     (300, 500, 1040)])
def test_a_wide_product_in_panels_gives_each_column_the_bits_it_has_alone(m, k, n):
    """Columns beyond one panel of b (_thin_jit.PANEL_BYTES of a block of k) go block of k by block: each element's
    blocks are still added in order, so a column has the bits of the product of its strip of 64 columns alone. From
    _thin_jit.PACK_ROWS rows of a each panel is copied first (the last panel narrower than the others)."""
    from layerforge.kernels import _thin_jit

    assert n * 4 * min(k, thin_gemm.BLOCK_K) > _thin_jit.PANEL_BYTES  # several panels
    rs = numpy.random.RandomState(m + k)
    a, b = rs.randn(m, k).astype(numpy.float32), rs.randn(k, n).astype(numpy.float32)
    whole = thin_gemm.matmul(a, b, threaded=False)
    for j in (0, 64 * 3, n // 64 * 64 - 64):
        numpy.testing.assert_array_equal(whole[:, j:j + 64],
                                         thin_gemm.matmul(a, numpy.ascontiguousarray(b[:, j:j + 64]), threaded=False))
    numpy.testing.assert_allclose(whole, a.astype(numpy.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("m, k, n", [(4608, 512, 49), (1024, 256, 196), (300, 70, 9)])
def test_a_transposed_a_with_few_columns_gives_the_bits_of_its_copy(m, k, n):
    """W^T gy with W^T a transposed view and few columns (a 7 x 7 layer's data gradient) is computed as (gy^T W)^T,
    which reads W as it lies: every element is the same chain over k of the same products."""
    rs = numpy.random.RandomState(n)
    w, gy = rs.randn(k, m).astype(numpy.float32), rs.randn(k, n).astype(numpy.float32)
    assert n * (k + m) < m * k
    swapped = thin_gemm.matmul(w.T, gy, threaded=False)
    numpy.testing.assert_array_equal(swapped, thin_gemm.matmul(numpy.ascontiguousarray(w.T), gy, threaded=False))
    numpy.testing.assert_allclose(swapped, w.T.astype(numpy.float64) @ gy, rtol=1e-4, atol=1e-3)
