"""kernels.blas: the precision switch of every matrix product, and the cuBLAS call of the GPU path.

The GPU path's column-major bookkeeping (operand order, transpose flags, leading dimensions, batch strides,
broadcasting, accumulation) is checked here without a device: a stand-in for cupy keeps the arrays in host
memory and a stand-in for cuBLAS's gemmStridedBatchedEx reads and writes that memory exactly as cuBLAS
defines the call (column-major, op(A) m x k, op(B) k x n, C m x n, alpha op(A) op(B) + beta C per batch).
"""
import ctypes
import sys
import types

import numpy
import pytest

from layerforge.kernels import blas
from layerforge.kernels.cuda import gemm


@pytest.fixture
def precision():
    saved = blas._PRECISION["gemm"]
    yield blas.set_gemm_precision
    blas._PRECISION["gemm"] = saved


def rand(shape, seed=0, dtype=numpy.float32):
    return numpy.random.default_rng(seed).normal(size=shape).astype(dtype)


# --- the precision switch on numpy ---------------------------------------------------------------

def test_bfloat16_rounding_agrees_with_torch():
    torch = pytest.importorskip("torch")
    x = numpy.concatenate([rand(10000) * 1e3, [0.0, -0.0, numpy.inf, -numpy.inf, numpy.nan, 3.4e38, 1e-40],
                           # halfway cases: ties go to the even bfloat16
                           numpy.array([0x3F808000, 0x3F818000, 0x3F80FFFF], numpy.uint32).view(numpy.float32)])
    want = torch.from_numpy(x.astype(numpy.float32)).to(torch.bfloat16).float().numpy()
    numpy.testing.assert_array_equal(blas.round_to_bfloat16(x.astype(numpy.float32)), want)


@pytest.mark.parametrize("name, bits", [("fp32", 24), ("tf32", 24), ("fp16", 11), ("bf16", 8)])
def test_products_round_their_operands_to_the_precision(precision, name, bits):
    torch = pytest.importorskip("torch")
    precision(name)
    a, b = rand((3, 40, 70), 1), rand((70, 50), 2)
    got = blas.matmul(a, b)
    to = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(name, torch.float32)
    want = (torch.from_numpy(a).to(to).float() @ torch.from_numpy(b).to(to).float()).numpy()
    numpy.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    exact = a.astype(numpy.float64) @ b.astype(numpy.float64)
    error = numpy.abs(got - exact).max() / numpy.abs(exact).max()
    # the operands' rounding (unit roundoff 2^-bits) dominates: sqrt(70) random terms of relative size 2^-bits
    assert error < 2.0 ** -bits * 8 and (bits == 24 or error > 2.0 ** -bits / 8)


def test_add_matmul_accumulates_under_the_precision(precision):
    precision("bf16")
    a, b, c = rand((30, 20), 1), rand((20, 10), 2), rand((30, 10), 3)
    want = c + blas.round_to_bfloat16(a) @ blas.round_to_bfloat16(b)
    # the same products; the AVX512_BF16 kernel (kernels/bf16_gemm.py) sums them in another order
    numpy.testing.assert_allclose(blas.add_matmul(c, a, b), want, rtol=1e-6, atol=1e-6 * numpy.abs(want).max())


@pytest.mark.parametrize("shapes", [
    ((64, 3000), (576, 3000)),  # a filter gradient gy col^T, K > Cout, long P: formed as (col gy^T)^T
    ((256, 3000), (64, 3000)),  # a widening 1x1 filter: as written
    ((64, 196), (576, 196)),  # a short P: as written
    ((2, 8, 300), (2, 40, 300)),  # batched over groups
])
@pytest.mark.parametrize("name", ["fp32", "bf16"])
def test_add_matmul_nt_is_c_plus_a_times_b_transposed(precision, shapes, name):
    precision(name)
    a, b = rand(shapes[0], 1), rand(shapes[1], 2)
    c = rand(a.shape[:-1] + (b.shape[-2],), 3)
    rounded = blas.round_to_bfloat16 if name == "bf16" else (lambda v: v)
    want = c.astype(numpy.float64) + rounded(a).astype(numpy.float64) @ rounded(b).astype(numpy.float64).swapaxes(-1, -2)
    got = blas.add_matmul_nt(c, a, b)
    assert got is c
    numpy.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("shapes, product", [
    (((64, 3000), (576, 3000)), (576, 64)),  # formed as (col gy^T)^T: the GEMM's output (K, Cout) in C order
    (((256, 3000), (64, 3000)), (256, 64)),  # as written, into c
    (((64, 196), (576, 196)), (64, 576)),
    (((2, 8, 300), (2, 40, 300)), (2, 40, 8)),
])
def test_add_matmul_nt_lays_the_product_out_longer_side_first(monkeypatch, shapes, product):
    """A GEMM runs in the order its output lies in memory: the transposed product goes into a C-ordered temporary of
    (K, Cout), not into a transposed view of c, which OpenBLAS computes in c's order (the slow one)."""
    outputs, add_matmul = [], blas.add_matmul

    def spy(c, a, b, overwrite=False):
        outputs.append((c.shape, c.flags.c_contiguous))
        return add_matmul(c, a, b, overwrite)
    monkeypatch.setattr(blas, "add_matmul", spy)
    a, b = rand(shapes[0], 1), rand(shapes[1], 2)
    c = rand(a.shape[:-1] + (b.shape[-2],), 3)
    want = c.astype(numpy.float64) + a.astype(numpy.float64) @ b.astype(numpy.float64).swapaxes(-1, -2)
    blas.add_matmul_nt(c, a, b)
    assert outputs == [(product, True)]
    numpy.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-3)


def test_float64_is_never_rounded(precision):
    precision("bf16")
    a, b = rand((5, 6), 1, numpy.float64), rand((6, 7), 2, numpy.float64)
    numpy.testing.assert_array_equal(blas.matmul(a, b), a @ b)


def test_unknown_precision_is_one_line(monkeypatch, precision):
    from layerforge.errors import LayerforgeError
    with pytest.raises(LayerforgeError, match="GEMM precision 'fp8': use one of fp32, tf32, fp16, bf16"):
        precision("fp8")
    blas._PRECISION["gemm"] = None
    monkeypatch.setenv("LAYERFORGE_GEMM_PRECISION", "bf16")
    assert blas.gemm_precision() == "bf16"


# --- the GPU path against a stand-in cuBLAS --------------------------------------------------------

class FakeArray(numpy.ndarray):
    """A host array with cupy's ``.data.ptr``."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


def fake(x):
    return numpy.asarray(x).view(FakeArray)


CTYPE = {gemm.CUDA_R_32F: (ctypes.c_float, numpy.float32), gemm.CUDA_R_64F: (ctypes.c_double, numpy.float64)}


def matrix_at(ptr, dtype_code, rows, cols, ld, offset):
    """The column-major rows x cols matrix with leading dimension ``ld`` at element ``offset`` after ``ptr``."""
    assert ld >= max(1, rows), (ld, rows)
    ctype, dtype = CTYPE[dtype_code]
    n = offset + (cols - 1) * ld + rows
    flat = numpy.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctype)), shape=(n,))
    item = numpy.dtype(dtype).itemsize
    return numpy.lib.stride_tricks.as_strided(flat[offset:], shape=(rows, cols), strides=(item, ld * item))


def fake_gemm_strided_batched_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                                 strideB, beta, C, Ctype, ldc, strideC, count, compute, algo):
    calls.append(dict(transa=transa, transb=transb, m=m, n=n, k=k, strides=(strideA, strideB, strideC),
                      count=count, compute=compute))
    scalar = CTYPE[Ctype][0]
    alpha, beta = scalar.from_address(alpha).value, scalar.from_address(beta).value
    for i in range(count):
        a = matrix_at(A, Atype, *((m, k) if transa == gemm.OP_N else (k, m)), lda, i * strideA)
        b = matrix_at(B, Btype, *((k, n) if transb == gemm.OP_N else (n, k)), ldb, i * strideB)
        c = matrix_at(C, Ctype, m, n, ldc, i * strideC)
        a = a if transa == gemm.OP_N else a.T
        b = b if transb == gemm.OP_N else b.T
        product = alpha * (a.astype(numpy.float64) @ b)
        c[...] = product if beta == 0 else product + beta * c  # with beta 0, C is not read (cuBLAS)


calls = []


@pytest.fixture
def fake_cupy(monkeypatch):
    module = types.SimpleNamespace(
        ndarray=FakeArray,
        broadcast_to=lambda x, shape: numpy.broadcast_to(x, shape, subok=True),
        ascontiguousarray=lambda x: fake(numpy.ascontiguousarray(x)),
        empty=lambda shape, dtype: fake(numpy.empty(shape, dtype)),
        may_share_memory=numpy.may_share_memory,
        cuda=types.SimpleNamespace(device=types.SimpleNamespace(get_cublas_handle=lambda: 1)))
    libs = types.SimpleNamespace(cublas=types.SimpleNamespace(gemmStridedBatchedEx=fake_gemm_strided_batched_ex))
    monkeypatch.setitem(sys.modules, "cupy", module)
    monkeypatch.setitem(sys.modules, "cupy.cuda", module.cuda)
    # the plain cuBLAS call: batch invariance pads small products first (tests/net/test_batch_invariance.py's emulated
    # GPU cases), with arrays this fake does not make
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", False)
    monkeypatch.setitem(sys.modules, "cupy_backends", types.SimpleNamespace(cuda=types.SimpleNamespace(libs=libs)))
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda", types.SimpleNamespace(libs=libs))
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs", libs)
    calls.clear()
    yield module


def layouts():
    """(a, b) pairs in the layouts the engines and layers use: plain, transposed views, batched, broadcast."""
    a, b = rand((2, 3, 5, 4), 1), rand((2, 3, 4, 6), 2)
    return {
        "2-d": (a[0, 0], b[0, 0]),
        "a transposed": (rand((4, 5), 3).T, b[0, 0]),
        "b transposed": (a[0, 0], rand((6, 4), 4).T),
        "both transposed": (rand((4, 5), 3).T, rand((6, 4), 4).T),
        "batched": (a, b),
        "batched, b transposed": (a[0], rand((3, 6, 4), 5).transpose(0, 2, 1)),
        "a broadcast over the batch": (a[0, 0], b),
        "b broadcast over a 4-d batch": (a, b[0]),
        "strided slice": (rand((5, 9), 6)[:, ::2][:, :4], b[0, 0]),
        "a column": (rand((5, 1), 7), rand((1, 6), 8)),
        "float64": (a[0].astype(numpy.float64), b[0].astype(numpy.float64)),
    }


@pytest.mark.parametrize("case", list(layouts()))
def test_the_cublas_call_computes_numpys_product(fake_cupy, case):
    a, b = layouts()[case]
    got = blas.matmul(fake(a), fake(b))
    assert isinstance(got, FakeArray) and got.dtype == a.dtype
    numpy.testing.assert_allclose(got, numpy.matmul(a.astype(numpy.float64), b), rtol=1e-6, atol=1e-6)
    assert len(calls) == 1 and calls[0]["count"] == max(1, int(numpy.prod(got.shape[:-2])))


def test_transposed_views_are_passed_without_a_copy(fake_cupy):
    a, b = rand((4, 5), 3).T, rand((6, 4), 4).T
    blas.matmul(fake(a), fake(b))
    assert (calls[0]["transa"], calls[0]["transb"]) == (gemm.OP_T, gemm.OP_T)  # op(B), op(A): both as they lie
    w, x = rand((3, 5, 4), 1), rand((2, 3, 4, 6), 2)
    blas.matmul(fake(w[0]), fake(x))
    assert calls[1]["strides"][1] == 0  # the one matrix of the broadcast operand is reused by every product


@pytest.mark.parametrize("name", ["fp32", "tf32", "fp16", "bf16"])
def test_each_precision_asks_cublas_for_its_compute_type(fake_cupy, precision, name):
    precision(name)
    blas.matmul(fake(rand((3, 4))), fake(rand((4, 5))))
    blas.matmul(fake(rand((3, 4), dtype=numpy.float64)), fake(rand((4, 5), dtype=numpy.float64)))
    assert [c["compute"] for c in calls] == [gemm.COMPUTE_TYPES[name], gemm.COMPUTE_64F]


def test_out_and_accumulate(fake_cupy):
    a, b = rand((3, 5, 4), 1), rand((3, 4, 6), 2)
    out = fake(numpy.zeros((3, 5, 6), numpy.float32))
    assert blas.matmul(fake(a), fake(b), out=out) is out
    numpy.testing.assert_allclose(out, a @ b, rtol=1e-6, atol=1e-6)
    c = rand((5, 6), 3)
    strided = fake(numpy.zeros((5, 12), numpy.float32))[:, ::2]  # not C-contiguous: computed aside, copied in
    strided[...] = c
    blas.add_matmul(strided, fake(a[0]), fake(b[0]))
    numpy.testing.assert_allclose(strided, c + a[0] @ b[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="do not align"):
        blas.matmul(fake(a), fake(a))


@pytest.mark.parametrize("engine", ["IM2COL", "IMPLICIT", "WINOGRAD_F2"])
def test_the_switch_reaches_every_layer_product_and_training_still_follows(precision, engine):
    from layerforge import get_solver
    from tests.net.test_fusion import resnet_block

    runs = {}
    for name in ("fp32", "bf16"):
        precision(name)
        net = resnet_block(True)
        for layer in net["layers"]:
            if layer["type"] == "Convolution":
                layer["convolution"]["engine"] = engine
        solver = get_solver(dict(net_param=net, base_lr=0.1, momentum=0.9, max_iter=8, average_loss=8, random_seed=2,
                                 display=0, snapshot=0, snapshot_after_train=False))
        solver.solve()
        runs[name] = numpy.array(solver.losses)
    # bf16 operands (8-bit mantissa) move every loss off the fp32 run's, but only by about their rounding
    assert not numpy.array_equal(runs["bf16"], runs["fp32"])
    numpy.testing.assert_allclose(runs["bf16"], runs["fp32"], rtol=0.03)


GAUSSIAN = {"type": "gaussian", "std": 1.0}
CONV = {"num_output": 6, "kernel_size": 3, "pad": 1, "bias_term": False, "weight_filler": GAUSSIAN}
LAYERS = {
    "conv IM2COL": {"type": "Convolution", "convolution": dict(CONV, engine="IM2COL")},
    "conv IMPLICIT": {"type": "Convolution", "convolution": dict(CONV, engine="IMPLICIT")},
    "conv N-d": {"type": "Convolution", "convolution": dict(CONV, force_nd_im2col=True)},
    "InnerProduct": {"type": "InnerProduct", "inner_product": {"num_output": 7, "bias_term": False,
                                                                      "weight_filler": GAUSSIAN}},
}


@pytest.mark.parametrize("kernel", [False, True], ids=["emulated", "avx512_bf16"])
@pytest.mark.parametrize("kind", list(LAYERS))
def test_a_layer_under_bf16_computes_on_bfloat16_operands(precision, kind, kernel, monkeypatch):
    """Rounding commutes with lowering: under bf16 a layer's output is, bit for bit, the fp32 output of the
    bfloat16-rounded input and weights (the same GEMMs on the same operands); with the AVX512_BF16 kernel
    (kernels/bf16_gemm.py), to the rounding of the same sums in another order."""
    from layerforge.blob import Blob
    from layerforge.kernels import bf16_gemm

    if kernel and not bf16_gemm.available():
        pytest.skip("no AVX512_BF16 on this CPU")
    monkeypatch.setattr(bf16_gemm, "available", lambda: kernel)
    from layerforge.layers import create_layer
    from layerforge.testing import make_blob

    x = rand((2, 5, 7, 7), 1)

    def forward(name, x, weights=None):
        precision(name)
        layer = create_layer(LAYERS[kind], dtype=numpy.float32)
        bottom, top = make_blob(x, numpy.float32), Blob((), numpy.float32)
        layer.setup([bottom], [top])
        if weights is not None:
            layer.blobs[0].data[...] = weights
        layer.forward([bottom], [top])
        return layer.blobs[0].data.copy(), top.data.copy()

    w, y_bf16 = forward("bf16", x)
    _, y_rounded = forward("fp32", blas.round_to_bfloat16(x), blas.round_to_bfloat16(w))
    _, y_fp32 = forward("fp32", x, w)
    if kernel:
        numpy.testing.assert_allclose(y_bf16, y_rounded, rtol=1e-6, atol=1e-6 * numpy.abs(y_rounded).max())
    else:
        numpy.testing.assert_array_equal(y_bf16, y_rounded)
    assert not numpy.array_equal(y_bf16, y_fp32)


def test_the_solver_key_sets_the_switch(precision):
    from layerforge import get_solver
    from tests.net.test_fusion import resnet_block

    precision("fp32")
    get_solver(dict(net_param=resnet_block(False), gemm_precision="bf16", max_iter=1, display=0))
    assert blas.gemm_precision() == "bf16"


@pytest.mark.parametrize("shape", [(30, 20, 10), (2048, 8, 4096)])  # the second through SciPy's in-place GEMM
def test_add_matmul_overwrite_never_reads_c(shape):
    m, k, n = shape
    a, b = rand((k, m), 1).T, rand((k, n), 2)
    c = numpy.full((m, n), numpy.nan, numpy.float32)
    blas.add_matmul(c, a, b, overwrite=True)
    numpy.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("m, n", [(500, 800), (1, 7), (64, 1)])
def test_add_matmul_of_an_outer_product_is_the_products_bits(overwrite, m, n):
    """A weight gradient at batch 1 sums one product per element (numpy's matmul of a summed axis of one runs its own
    loop, not the BLAS: 0.4 ms for 500 x 800 against 0.14 for the broadcast product); each is the rounded product."""
    a, b = rand((1, m), 3).T, rand((1, n), 4)
    c = rand((m, n), 5)
    expected = (a.astype(numpy.float64) * b).astype(numpy.float32) + (0 if overwrite else c)
    assert blas.add_matmul(c, a, b, overwrite=overwrite) is c
    numpy.testing.assert_array_equal(c, expected)


@pytest.mark.parametrize("batch", [(1,), (1, 1), (3,)])
def test_an_accumulation_on_one_thread_goes_to_cblas_matrix_by_matrix(monkeypatch, batch):
    """On one kernel thread, c += a @ b of one matrix behind axes of one (a convolution's filter gradient, (1, Cout,
    K)) or of a stack is accumulated in place matrix by matrix (cblas_sgemm, beta 1), not as a temporary product
    added to c: the same sums as the 2-D product's."""
    from layerforge.kernels import threadpool
    if not blas._openblas_control() or blas._openblas_control()[2] is None:
        pytest.skip("this BLAS has no cblas_sgemm")
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", True)
    monkeypatch.setattr(threadpool, "_state", dict(threadpool._state, threads=1))
    pieces = []
    piece = blas._piece
    monkeypatch.setattr(blas, "_piece", lambda a, b, out, *rest: (pieces.append(out.ndim), piece(a, b, out, *rest)))
    a, b, c = rand(batch + (96, 400), 1), rand(batch + (400, 300), 2), rand(batch + (96, 300), 3)
    want = [c2 + a2 @ b2 for a2, b2, c2 in zip(a.reshape(-1, 96, 400), b.reshape(-1, 400, 300), c.reshape(-1, 96, 300))]
    flat = [blas.add_matmul(c2.copy(), a2, b2) for a2, b2, c2 in zip(a.reshape(-1, 96, 400), b.reshape(-1, 400, 300),
                                                                       c.reshape(-1, 96, 300))]
    blas.add_matmul(c, a, b)
    assert pieces and set(pieces) == {2}
    for got, two_d, expected in zip(c.reshape(-1, 96, 300), flat, want):
        assert got.tobytes() == two_d.tobytes()
        numpy.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
