"""cuBLAS on the emulated device: the handle plumbing and ``gemmStridedBatchedEx``, with cuBLAS's semantics.

``gemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo)`` computes, for each batch i,
``C_i = alpha op(A_i) op(B_i) + beta C_i`` on column-major matrices: op(A) is m x k, op(B) k x n, C m x n;
element (r, c) of a matrix with leading dimension ld is ``ld * c + r`` elements from its start, batch i
starts ``i * stride`` elements further. As cuBLAS:

- a negative size or batch count, a transpose flag other than N/T/C, or a leading dimension below the rows
  of the matrix as stored (``lda < max(1, m)`` for A with N, ``max(1, k)`` with T; likewise B; ``ldc <
  max(1, m)``) raises ``CUBLASError: CUBLAS_STATUS_INVALID_VALUE``; a data / compute type pair cuBLAS does
  not offer raises ``CUBLAS_STATUS_NOT_SUPPORTED``;
- the operands are resolved in the allocation registry: any matrix element outside the live allocation
  the pointer lies in raises ``cudaErrorIllegalAddress`` (on a device, a fault or silent garbage);
- alpha and beta are read from host memory at the call (the handle's default pointer mode), and C is not
  read when beta is 0 (its memory may hold anything);
- float32 data under ``CUBLAS_COMPUTE_32F_FAST_TF32`` has its operands rounded to TF32 (10-bit mantissa,
  to nearest, ties away from zero: PTX ``cvt.rna.tf32.f32``), under ``_FAST_16F`` to half and under
  ``_FAST_16BF`` to bfloat16 (to nearest even, as ``cvt.rn``), always: cuBLAS *may* use the faster type, the
  emulator takes the least precise it may use. Products accumulate in fp32 (numpy's float32 matmul),
  alpha and beta are applied in the scale type (fp32 for the 32F types, fp64 for 64F).

The call is submitted to the current stream like every device operation (cupy sets the handle's stream to
the current stream at each call).
"""
import ctypes
import itertools
import threading

import numpy

from . import allocations, streams
from .runtime import getDevice

STATUS = {0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
          7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
          13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
          15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR"}
STATUS_INVALID_VALUE, STATUS_NOT_SUPPORTED = 7, 15
CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C = 0, 1, 2
CUBLAS_POINTER_MODE_HOST, CUBLAS_POINTER_MODE_DEVICE = 0, 1
CUBLAS_GEMM_DEFAULT = -1
CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF = 0, 1, 2, 14
CUBLAS_COMPUTE_16F, CUBLAS_COMPUTE_16F_PEDANTIC, CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_PEDANTIC = 64, 65, 68, 69
CUBLAS_COMPUTE_32F_FAST_16F, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_COMPUTE_32F_FAST_TF32 = 74, 75, 77
CUBLAS_COMPUTE_64F, CUBLAS_COMPUTE_64F_PEDANTIC = 70, 71

DTYPES = {CUDA_R_32F: numpy.dtype(numpy.float32), CUDA_R_64F: numpy.dtype(numpy.float64),
          CUDA_R_16F: numpy.dtype(numpy.float16)}
# (data type, compute type) -> (scale type, operand rounding)
COMBINATIONS = {
    (CUDA_R_16F, CUBLAS_COMPUTE_16F): (numpy.float16, None),
    (CUDA_R_16F, CUBLAS_COMPUTE_16F_PEDANTIC): (numpy.float16, None),
    (CUDA_R_16F, CUBLAS_COMPUTE_32F): (numpy.float32, None),
    (CUDA_R_16F, CUBLAS_COMPUTE_32F_PEDANTIC): (numpy.float32, None),
    (CUDA_R_32F, CUBLAS_COMPUTE_32F): (numpy.float32, None),
    (CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC): (numpy.float32, None),
    (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32): (numpy.float32, "tf32"),
    (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16F): (numpy.float32, "fp16"),
    (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF): (numpy.float32, "bf16"),
    (CUDA_R_64F, CUBLAS_COMPUTE_64F): (numpy.float64, None),
    (CUDA_R_64F, CUBLAS_COMPUTE_64F_PEDANTIC): (numpy.float64, None),
}


class CUBLASError(RuntimeError):
    """cupy's ``CUBLASError``: ``status``, and the status name as the message."""

    def __init__(self, status):
        self.status = status
        super().__init__(STATUS[status])

    def __reduce__(self):
        return type(self), (self.status,)


class _Handle:
    def __init__(self, device_id):
        self.device_id, self.stream, self.pointer_mode, self.math_mode = device_id, 0, CUBLAS_POINTER_MODE_HOST, 0


_handles, _ids, _lock = {}, itertools.count(0x7000), threading.Lock()
_per_device = {}


def create():
    with _lock:
        handle = next(_ids)
        _handles[handle] = _Handle(getDevice())
    return handle


def destroy(handle):
    with _lock:
        _handles.pop(handle, None)


def _handle(handle):
    try:
        return _handles[handle]
    except KeyError:
        raise CUBLASError(1) from None


def handle_of(device_id):
    """The handle cupy keeps for a device (``cupy.cuda.device.get_cublas_handle()``)."""
    with _lock:
        if device_id not in _per_device:
            _per_device[device_id] = next(_ids)
            _handles[_per_device[device_id]] = _Handle(device_id)
        return _per_device[device_id]


def get_cublas_handle():
    """``cupy.cuda.device.get_cublas_handle()``: the current device's handle."""
    return handle_of(getDevice())


def setStream(handle, stream):
    _handle(handle).stream = stream


def getStream(handle):
    return _handle(handle).stream


def setPointerMode(handle, mode):
    _handle(handle).pointer_mode = mode


def getPointerMode(handle):
    return _handle(handle).pointer_mode


def setMathMode(handle, mode):
    _handle(handle).math_mode = mode


def getMathMode(handle):
    return _handle(handle).math_mode


def round_to_tf32(x):
    """float32 ``x`` rounded to TF32 (10 mantissa bits; to nearest, ties away from zero), as float32."""
    u = numpy.ascontiguousarray(x, dtype=numpy.float32).view(numpy.uint32)
    rounded = ((u + numpy.uint32(0x1000)) & numpy.uint32(0xFFFFE000)).view(numpy.float32)
    return numpy.where(numpy.isnan(x), x, rounded)


def round_to_bfloat16(x):
    """float32 ``x`` rounded to bfloat16 (7 mantissa bits; to nearest, ties to even), as float32; NaN stays NaN."""
    u = numpy.ascontiguousarray(x, dtype=numpy.float32).view(numpy.uint32)
    rounded = ((u + (numpy.uint32(0x7FFF) + ((u >> 16) & 1))) & numpy.uint32(0xFFFF0000)).view(numpy.float32)
    return numpy.where(numpy.isnan(x), x, rounded)


def _rounded(x, rounding):
    if rounding == "tf32":
        return round_to_tf32(x)
    if rounding == "fp16":
        return x.astype(numpy.float16).astype(numpy.float32)
    if rounding == "bf16":
        return round_to_bfloat16(x)
    return x


def _matrix(ptr, rows, cols, ld, stride, batch, dtype):
    """A column-major rows x cols matrix batch at ``ptr`` as a (batch, rows, cols) numpy view, through the
    allocation registry (cudaErrorIllegalAddress for an element outside the allocation)."""
    size = dtype.itemsize
    if rows == 0 or cols == 0 or batch == 0:
        return numpy.zeros((batch, rows, cols), dtype)
    low = min(0, stride * (batch - 1))
    high = ld * (cols - 1) + rows - 1 + max(0, stride * (batch - 1))
    alloc = allocations.lookup(ptr + low * size, (high - low + 1) * size)
    return numpy.ndarray((batch, rows, cols), dtype, buffer=alloc.buffer, offset=ptr - alloc.ptr,
                         strides=(stride * size, size, ld * size))


def _scalar(ptr, scale, mode):
    if mode == CUBLAS_POINTER_MODE_DEVICE:
        return allocations.host_view(ptr, numpy.dtype(scale).itemsize).view(scale)[0]
    return numpy.frombuffer((ctypes.c_char * numpy.dtype(scale).itemsize).from_address(ptr), scale)[0]


def gemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB,
                         beta, C, Ctype, ldc, strideC, batchCount, computeType, algo):
    h = _handle(handle)
    if (min(m, n, k, batchCount) < 0 or transa not in (0, 1, 2) or transb not in (0, 1, 2)
            or lda < max(1, m if transa == CUBLAS_OP_N else k) or ldb < max(1, k if transb == CUBLAS_OP_N else n)
            or ldc < max(1, m)):
        raise CUBLASError(STATUS_INVALID_VALUE)
    if not (Atype == Btype == Ctype) or (Atype, computeType) not in COMBINATIONS:
        raise CUBLASError(STATUS_NOT_SUPPORTED)
    dtype, (scale, rounding) = DTYPES[Atype], COMBINATIONS[(Atype, computeType)]
    shape_a = (m, k) if transa == CUBLAS_OP_N else (k, m)
    shape_b = (k, n) if transb == CUBLAS_OP_N else (n, k)
    alpha_value, beta_value = _scalar(alpha, scale, h.pointer_mode), _scalar(beta, scale, h.pointer_mode)
    if m == 0 or n == 0 or batchCount == 0:
        return
    for ptr, (rows, cols), ld, stride in ((A, shape_a, lda, strideA), (B, shape_b, ldb, strideB)):
        if k:
            _matrix(ptr, rows, cols, ld, stride, batchCount, dtype)  # out of bounds raises now
    _matrix(C, m, n, ldc, strideC, batchCount, dtype)

    def gemm():
        c = _matrix(C, m, n, ldc, strideC, batchCount, dtype)
        if k:
            a = _matrix(A, *shape_a, lda, strideA, batchCount, dtype)
            b = _matrix(B, *shape_b, ldb, strideB, batchCount, dtype)
            a = a if transa == CUBLAS_OP_N else a.transpose(0, 2, 1)
            b = b if transb == CUBLAS_OP_N else b.transpose(0, 2, 1)
            accumulate = numpy.float32 if dtype == numpy.float16 else dtype
            product = numpy.matmul(_rounded(a, rounding).astype(accumulate), _rounded(b, rounding).astype(accumulate))
        else:
            product = numpy.zeros(c.shape, dtype)
        with numpy.errstate(all="ignore"):
            value = scale(alpha_value) * product.astype(scale)
            if beta_value != 0:
                value = value + scale(beta_value) * c.astype(scale)
        c[...] = value

    streams.submit(gemm, name="cublasGemmStridedBatchedEx")
