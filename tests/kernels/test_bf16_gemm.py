"""The AVX512_BF16 GEMM (kernels/bf16_gemm.py) against float64 products of the bfloat16-rounded operands."""
import numpy
import pytest

from layerforge.kernels import bf16_gemm, blas, threadpool

pytestmark = pytest.mark.skipif(not bf16_gemm.available(), reason="no AVX512_BF16 on this CPU (or numba)")


def rand(shape, seed):
    return numpy.random.default_rng(seed).standard_normal(shape).astype(numpy.float32)


def exact(a, b):
    return blas.round_to_bfloat16(a).astype(numpy.float64) @ blas.round_to_bfloat16(b).astype(numpy.float64)


def close(got, want):
    # fp32 sums of exact products: a few units of fp32 rounding of the largest partial sums
    numpy.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * numpy.abs(want).max())


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (12, 2, 32), (13, 7, 33), (25, 385, 65), (200, 769, 97), (64, 576, 100)])
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_products_of_every_edge_and_layout(m, k, n, layout):
    """Tiles and blocks that do not divide (MR 12, NR 32, MC 192, KC 384, odd K), operands as transposed views."""
    a = rand((k, m), 1).T if layout[0] == "t" else rand((m, k), 1)
    b = rand((n, k), 2).T if layout[1] == "t" else rand((k, n), 2)
    close(bf16_gemm.matmul(a, b), exact(a, b))


def test_batched_broadcast_into_a_strided_out_and_accumulate():
    a, b = rand((3, 2, 20, 30), 1), rand((2, 30, 40), 2)
    want = exact(a, b)
    close(bf16_gemm.matmul(a, b), want)
    out = numpy.zeros((3, 2, 40, 20), numpy.float32).swapaxes(-1, -2)  # a transposed view
    bf16_gemm.matmul(a, b, out)
    close(out, want)
    c = rand((3, 2, 20, 40), 3)
    bf16_gemm.matmul(a, b, c, accumulate=True)
    close(c, want + rand((3, 2, 20, 40), 3))


def test_rounding_ties_to_even_and_special_values():
    # operands that bfloat16 must round: ties go to the even neighbour, as blas.round_to_bfloat16 (torch's) does
    x = numpy.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F800001], numpy.uint32).view(numpy.float32)
    got = bf16_gemm.matmul(x[:, None], numpy.ones((1, 1), numpy.float32))[:, 0]
    numpy.testing.assert_array_equal(got, blas.round_to_bfloat16(x))
    special = numpy.array([[numpy.inf, 1.0], [numpy.nan, 1.0], [1.0, 2.0]], numpy.float32)
    got = bf16_gemm.matmul(special, numpy.ones((2, 3), numpy.float32))
    assert numpy.isposinf(got[0]).all() and numpy.isnan(got[1]).all() and (got[2] == 3.0).all()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_same_bits_for_any_thread_count(threads):
    a, b = rand((70, 500), 1), rand((500, 300), 2)
    threadpool.set_num_threads(1)
    try:
        one = bf16_gemm.matmul(a, b)
        threadpool.set_num_threads(threads)
        numpy.testing.assert_array_equal(bf16_gemm.matmul(a, b), one)
    finally:
        threadpool.set_num_threads(None)


def test_agrees_with_torch_bfloat16_matmul():
    torch = pytest.importorskip("torch")
    a, b = rand((33, 250), 1), rand((250, 47), 2)
    want = (torch.from_numpy(a).bfloat16().float() @ torch.from_numpy(b).bfloat16().float()).numpy()
    close(bf16_gemm.matmul(a, b), want)


def test_the_precision_switch_sends_float32_products_here(monkeypatch):
    calls = []
    real = bf16_gemm.matmul
    monkeypatch.setattr(bf16_gemm, "matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    saved = blas._PRECISION["gemm"]
    try:
        blas.set_gemm_precision("bf16")
        a, b = rand((5, 6), 1), rand((6, 7), 2)
        close(blas.matmul(a, b), exact(a, b))
        c = numpy.zeros((5, 7), numpy.float32)
        close(blas.add_matmul(c, a, b), exact(a, b))
        blas.matmul(a.astype(numpy.float64), b.astype(numpy.float64))  # float64: never rounded, never here
        assert len(calls) == 2
        blas.set_gemm_precision("fp32")
        blas.matmul(a, b)
        assert len(calls) == 2
    finally:
        blas._PRECISION["gemm"] = saved
