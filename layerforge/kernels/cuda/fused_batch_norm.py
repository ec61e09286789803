"""GPU bodies of :mod:`layerforge.kernels.fused_batch_norm` (fused_batch_norm.cu), on (N, C, S) views."""
from . import launch, run, scalar

_THREADS = 256  # fused_batch_norm.cu's FBN_THREADS: one block per channel for the sums


def _relu(dtype, negative_slope):
    return (0, scalar(dtype, 0)) if negative_slope is None else (1, scalar(dtype, negative_slope))


def scale_shift_relu_gpu(x_norm, gamma, beta, negative_slope, out):
    import cupy

    x_norm = cupy.ascontiguousarray(x_norm)
    gamma, beta = (cupy.ascontiguousarray(a, dtype=x_norm.dtype) for a in (gamma, beta))
    n, c, s = x_norm.shape
    target = out if out.flags.c_contiguous else cupy.empty_like(x_norm)  # the kernels index flat arrays
    launch("fused_batch_norm", "scale_shift_relu", x_norm.dtype, x_norm.size,
           (x_norm, gamma, beta, target, x_norm.size, c, s, *_relu(x_norm.dtype, negative_slope)))
    if target is not out:
        out[...] = target
    return out


def grad_sums_gpu(gy, y, x_norm, negative_slope):
    """``(sum gz, sum gz x_norm)`` per channel, gz the ReLU-masked gy."""
    import cupy

    gy, y, x_norm = (cupy.ascontiguousarray(a) for a in (gy, y, x_norm))
    n, c, s = gy.shape
    sum_gz, sum_gz_xn = cupy.empty(c, dtype=gy.dtype), cupy.empty(c, dtype=gy.dtype)
    run("fused_batch_norm", "fused_grad_sums", gy.dtype, (c,), (_THREADS,),
        (gy, y, x_norm, sum_gz, sum_gz_xn, n, c, s, *_relu(gy.dtype, negative_slope)))
    return sum_gz, sum_gz_xn


def fused_backward_gpu(gy, y, x_norm, coef_gz, coef_xn, shift, negative_slope, gx):
    """``gx = coef_gz gz - coef_xn x_norm - shift`` per channel (``gx`` may be ``gy``)."""
    import cupy

    coef_gz, coef_xn, shift = (cupy.ascontiguousarray(a, dtype=gy.dtype) for a in (coef_gz, coef_xn, shift))
    gy_in, y, x_norm = (cupy.ascontiguousarray(a) for a in (gy, y, x_norm))
    n, c, s = gy.shape
    target = gx if gx.flags.c_contiguous else cupy.empty_like(gy_in)  # elementwise: gx may alias gy
    launch("fused_batch_norm", "fused_backward", gy.dtype, gy.size,
           (gy_in, y, x_norm, coef_gz, coef_xn, shift, target, gy.size, c, s, *_relu(gy.dtype, negative_slope)))
    if target is not gx:
        gx[...] = target
    return gx
