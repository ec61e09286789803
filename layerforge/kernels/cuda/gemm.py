"""GPU body of :func:`layerforge.kernels.blas.matmul`: cuBLAS ``gemmStridedBatchedEx`` on cupy arrays.

cuBLAS is column-major: a C-contiguous (r, c) matrix is, to it, the (c, r) matrix with leading dimension c.
So ``C = A @ B`` (row-major, (M, K) @ (K, N)) is computed as ``C^T = B^T A^T``: cuBLAS's m, n, k are N, M,
K, its first operand is B and its second A. An operand that is the transpose of a C-contiguous matrix
(``x.T``, ``x.transpose(0, 2, 1)``) is passed as it lies with the transpose flag; any other layout is
copied. Batch axes are flattened to one stride per operand: 0 for an operand broadcast over the batch.

Batch invariance (``invariant``: blas.batch_invariant): a product that the host BLAS would compute off its
large-product path (thin_gemm.is_thin: one row or column, or few multiply-adds) is padded with zero rows / columns
until it is not, and the product's corner taken. On the emulated device, whose GEMM is the host's OpenBLAS, every
element then gets the large path's blocked FMA chain, the bits the CPU gives it, whatever the batch; the padding
adds zeros to no sum. On a real GPU cuBLAS chooses its kernels (split-K among them) by the shapes and makes no such
promise; the padding costs a few microseconds there.
"""
import math

import numpy

# cublasComputeType_t (cublas_api.h): the compute type of each precision of kernels.blas
COMPUTE_32F_PEDANTIC, COMPUTE_32F_FAST_16F, COMPUTE_32F_FAST_16BF, COMPUTE_32F_FAST_TF32 = 69, 74, 75, 77
COMPUTE_64F = 70
COMPUTE_TYPES = {"fp32": COMPUTE_32F_PEDANTIC, "tf32": COMPUTE_32F_FAST_TF32, "fp16": COMPUTE_32F_FAST_16F,
                 "bf16": COMPUTE_32F_FAST_16BF}
CUDA_R_32F, CUDA_R_64F = 0, 1  # cudaDataType_t
OP_N, OP_T = 0, 1
GEMM_DEFAULT = -1


def operand(x, batch):
    """``(array, op, ld, stride)`` that hand ``x`` (..., r, c), broadcast to the batch shape ``batch``, to
    cuBLAS as column-major (c, r) matrices. op N with leading dimension c when each matrix is C-contiguous,
    T with ld r when it is the transpose of a C-contiguous one; stride (in elements) 0 when x is one matrix
    for the whole batch, else the one stride its batch axes collapse into. Any other layout is copied."""
    import cupy

    x = cupy.broadcast_to(x, tuple(batch) + x.shape[-2:])
    r, c = x.shape[-2:]
    item = x.itemsize
    if x.strides[-1] == item and (x.strides[-2] == c * item or r == 1):
        op, ld = OP_N, c
    elif x.strides[-2] == item and (x.strides[-1] == r * item or c == 1):
        op, ld = OP_T, r
    else:
        op = None
    live = [(n, s // item) for n, s in zip(batch, x.strides[:-2]) if n > 1]
    stride = live[-1][1] if live else 0
    expected = stride
    for n, s in reversed(live):
        if s != expected:
            op = None
        expected = s * n
    if op is None or (stride < 0 or any(s < 0 for _, s in live)):
        x = cupy.ascontiguousarray(x)
        op, ld, stride = OP_N, c, (r * c if live else 0)
    return x, op, max(ld, 1), stride


def _padded(a, b, out, precision, accumulate):
    # gemm_gpu of a and b padded with zeros past the host BLAS's small-product sizes (see above); the corner kept
    import cupy

    from ..thin_gemm import SMALL_MNK

    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    wide = max(n, 2)
    tall = max(m, 2, SMALL_MNK // (wide * k) + 1)
    big_a = cupy.zeros(a.shape[:-2] + (tall, k), a.dtype)
    big_a[..., :m, :] = a
    big_b = cupy.zeros(b.shape[:-2] + (k, wide), b.dtype)
    big_b[..., :n] = b
    product = gemm_gpu(big_a, big_b, None, precision)[..., :m, :n]
    if out is None:
        return cupy.ascontiguousarray(product)
    if accumulate:
        out += product
    else:
        out[...] = product
    return out


def gemm_gpu(a, b, out, precision, accumulate=False, invariant=False):
    """``a @ b`` of cupy arrays (2-D or batched, numpy's broadcasting) through cuBLAS; written into ``out``
    (``out += a @ b`` with ``accumulate``) when given. float32 uses the compute type of ``precision``;
    ``invariant``: the padding of thin products (see above)."""
    import cupy
    from cupy.cuda import device
    from cupy_backends.cuda.libs import cublas

    from ..thin_gemm import is_thin

    if a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype or a.dtype not in (numpy.float32, numpy.float64):
        raise TypeError(f"gemm_gpu takes float32 or float64 matrices of one dtype, got {a.dtype} {a.shape} "
                        f"and {b.dtype} {b.shape}")
    M, K = a.shape[-2:]
    K2, N = b.shape[-2:]
    if K != K2:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not align")
    batch = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    shape = tuple(batch) + (M, N)
    if out is not None and out.shape != shape:
        raise ValueError(f"matmul: out has shape {out.shape}, the product {shape}")
    direct = out is not None and out.dtype == a.dtype and out.flags.c_contiguous and \
        not cupy.may_share_memory(out, a) and not cupy.may_share_memory(out, b)
    c = out if direct else cupy.empty(shape, a.dtype)
    if accumulate and not direct:
        c[...] = out
    if invariant and K and c.size and a.dtype == numpy.float32 and is_thin(M, N, K):
        return _padded(a, b, out, precision, accumulate)
    if c.size == 0:
        return c if out is None else out
    if K == 0:
        if not accumulate:
            c.fill(0)
    else:
        count = math.prod(batch)
        a, op_a, ld_a, stride_a = operand(a, batch)
        b, op_b, ld_b, stride_b = operand(b, batch)
        if a.dtype == numpy.float32:
            data_type, compute, scalars = CUDA_R_32F, COMPUTE_TYPES[precision], numpy.float32
        else:
            data_type, compute, scalars = CUDA_R_64F, COMPUTE_64F, numpy.float64
        alpha, beta = numpy.ones(1, scalars), numpy.full(1, 1.0 if accumulate else 0.0, scalars)
        cublas.gemmStridedBatchedEx(
            device.get_cublas_handle(), op_b, op_a, N, M, K, alpha.ctypes.data,
            b.data.ptr, data_type, ld_b, stride_b, a.data.ptr, data_type, ld_a, stride_a,
            beta.ctypes.data, c.data.ptr, data_type, max(N, 1), M * N, count, compute, GEMM_DEFAULT)
    if out is None or c is out:
        return c
    out[...] = c
    return out
