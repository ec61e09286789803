"""cuBLAS gemmStridedBatchedEx on the emulated device: column-major semantics, checks, and the operand rounding
of each compute type against a numpy reference that rounds the same way."""
import numpy
import pytest

from layerforge.kernels import blas
from layerforge.kernels.cuda import gemm
from layerforge_emulator import cublas, runtime
from tests.emulator.emulated import cupy  # noqa: F401 - the fixture


def operands(m=5, k=7, n=3, batch=2, dtype=numpy.float32, seed=0):
    g = numpy.random.default_rng(seed)
    # values with low mantissa bits set, so that every rounding changes them
    return (g.standard_normal((batch, m, k)) * (1 + 2 ** -12)).astype(dtype), \
        (g.standard_normal((batch, k, n)) * (1 + 2 ** -12)).astype(dtype)


def round_tf32_reference(x):
    """TF32 by arithmetic: the float32 value to 11 significant bits, ties away from zero."""
    mantissa, exponent = numpy.frexp(x.astype(numpy.float64))
    scaled = mantissa * 2.0 ** 11
    return (numpy.sign(scaled) * numpy.floor(numpy.abs(scaled) + 0.5) * 2.0 ** (exponent - 11)).astype(numpy.float32)


ROUNDING = {"fp32": lambda x: x, "tf32": round_tf32_reference,
            "fp16": lambda x: x.astype(numpy.float16).astype(numpy.float32), "bf16": blas.round_to_bfloat16}


@pytest.mark.parametrize("precision", sorted(ROUNDING))
def test_each_compute_type_rounds_the_operands_as_cublas_documents(cupy, precision):
    a, b = operands()
    got = gemm.gemm_gpu(cupy.asarray(a), cupy.asarray(b), None, precision).get()
    r = ROUNDING[precision]
    want = numpy.matmul(r(a), r(b))
    numpy.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    if precision != "fp32":  # the rounding is visible: the strict product differs
        assert numpy.abs(got - numpy.matmul(a, b)).max() > 1e-5


def test_tf32_rounding_is_ten_mantissa_bits_ties_away():
    x = numpy.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, -(1 + 2 ** -11), 1 + 2 ** -12, numpy.nan], numpy.float32)
    got = cublas.round_to_tf32(x)
    numpy.testing.assert_array_equal(got[:4], [1 + 2 ** -10, 1 + 2 ** -9, -(1 + 2 ** -10), 1.0])
    assert numpy.isnan(got[4])
    x = numpy.random.default_rng(1).standard_normal(1000).astype(numpy.float32)
    numpy.testing.assert_array_equal(cublas.round_to_tf32(x), round_tf32_reference(x))


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_transposed_operands_accumulate_and_broadcast(cupy, dtype):
    a, b = operands(dtype=dtype)
    c = numpy.ones((2, 5, 3), dtype)
    dc = cupy.asarray(c)
    gemm.gemm_gpu(cupy.asarray(a.transpose(0, 2, 1).copy()).transpose(0, 2, 1), cupy.asarray(b[0]), dc, "fp32",
                  accumulate=True)
    numpy.testing.assert_allclose(dc.get(), c + a @ b[0], rtol=1e-5)


def call(cupy, A, B, C, m, n, k, lda, ldb, ldc, compute=cublas.CUBLAS_COMPUTE_32F_PEDANTIC, dtype=cublas.CUDA_R_32F,
         strides=(0, 0, 0), batch=1, beta=0.0):
    alpha, beta = numpy.ones(1, numpy.float32), numpy.full(1, beta, numpy.float32)
    cublas.gemmStridedBatchedEx(cupy.cuda.device.get_cublas_handle(), 0, 0, m, n, k, alpha.ctypes.data, A.data.ptr,
                                dtype, lda, strides[0], B.data.ptr, dtype, ldb, strides[1], beta.ctypes.data,
                                C.data.ptr, dtype, ldc, strides[2], batch, compute, -1)


def test_bad_leading_dimensions_and_types_are_cublas_errors(cupy):
    A, B, C = cupy.ones(12, numpy.float32), cupy.ones(12, numpy.float32), cupy.zeros(12, numpy.float32)
    call(cupy, A, B, C, 3, 4, 3, 3, 3, 3)  # column-major 3x3 @ 3x4
    assert (C.get() == 3).all()
    for bad in [dict(lda=2), dict(ldb=2), dict(ldc=2), dict(m=-1)]:
        args = dict(m=3, n=4, k=3, lda=3, ldb=3, ldc=3) | bad
        with pytest.raises(cublas.CUBLASError, match="CUBLAS_STATUS_INVALID_VALUE"):
            call(cupy, A, B, C, **args)
    with pytest.raises(cublas.CUBLASError, match="CUBLAS_STATUS_NOT_SUPPORTED"):
        call(cupy, A, B, C, 3, 4, 3, 3, 3, 3, compute=cublas.CUBLAS_COMPUTE_64F)


def test_an_operand_past_its_allocation_is_an_illegal_address(cupy):
    A, B, C = cupy.ones(12, numpy.float32), cupy.ones(12, numpy.float32), cupy.zeros(12, numpy.float32)
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorIllegalAddress"):
        call(cupy, A, B, C, 3, 4, 3, 5, 3, 3)  # lda 5: A's last element is its 13th of 12
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorIllegalAddress"):
        call(cupy, A, B, C, 3, 2, 2, 3, 2, 3, strides=(0, 4, 8), batch=2)  # C's second matrix ends at 8 + 5
    call(cupy, A, B, C, 3, 2, 2, 3, 2, 3, strides=(0, 4, 6), batch=2)


def test_beta_zero_never_reads_c(cupy):
    A, B = cupy.ones(4, numpy.float32), cupy.ones(4, numpy.float32)
    C = cupy.empty(4, numpy.float32)  # poisoned: NaN
    call(cupy, A, B, C, 2, 2, 2, 2, 2, 2)
    assert (C.get() == 2).all()
    call(cupy, A, B, C, 2, 2, 2, 2, 2, 2, beta=1.0)
    assert (C.get() == 4).all()
