"""BatchNorm's passes over (N, C, S) views (statistics per channel over N and S), for numpy and cupy.

numpy arrays run xp bodies whose channel sums are GEMVs against ones (BLAS speed, where a sum over axes
(0, 2) walks strided rows); cupy arrays run batch_norm.cu (one block per channel for the sums).
"""
import numpy

from ..backend import get_array_module


def channel_sum(a):
    """Per-channel sum of an (N, C, S) array over N and S."""
    n, c, m = a.shape
    return (a.reshape(n * c, m) @ get_array_module(a).ones(m, dtype=a.dtype)).reshape(n, c).sum(axis=0)


def batch_stats(x, centred=None):
    """Per-channel mean and biased variance ``mean((x - mean)^2)`` of an (N, C, S) array.

    ``centred``: a contiguous buffer of x's shape that receives ``x - mean`` as a by-product.
    """
    xp = get_array_module(x)
    if xp is not numpy:
        from .cuda.batch_norm import batch_stats_gpu
        return batch_stats_gpu(x, centred)
    m = x.shape[0] * x.shape[2]
    mean = channel_sum(x) / m
    d = xp.subtract(x, mean[None, :, None].astype(x.dtype, copy=False), out=centred)
    return mean, channel_sum(d * d) / m


def batch_norm_backward(gy, y, inv_std, out):
    """``out = (gy - mean(gy) - mean(gy y) y) inv_std`` per channel (``out`` may be ``gy``)."""
    xp = get_array_module(gy)
    if xp is not numpy:
        from .cuda.batch_norm import batch_norm_backward_gpu
        return batch_norm_backward_gpu(gy, y, inv_std, out)
    m = y.shape[0] * y.shape[2]
    mean_gy = channel_sum(gy) / m
    prod = gy * y
    mean_gy_y = channel_sum(prod) / m
    xp.multiply(y, mean_gy_y[None, :, None], out=prod)
    xp.subtract(gy, prod, out=out)  # element-wise throughout: out may be gy
    out -= mean_gy[None, :, None]
    out *= inv_std[None, :, None]
    return out
