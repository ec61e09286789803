"""BatchNorm's batch-statistics passes over (N, C, S) views (statistics per channel over N and S).

numpy arrays run xp bodies; cupy arrays run batch_norm.cu (one block per channel for the sums).
"""
import numpy

from ..backend import get_array_module


def batch_stats(x):
    """Per-channel mean and biased variance ``mean((x - mean)^2)`` of an (N, C, S) array."""
    xp = get_array_module(x)
    if xp is not numpy:
        from .cuda.batch_norm import batch_stats_gpu
        return batch_stats_gpu(x)
    mean = x.mean(axis=(0, 2))
    d = x - mean[None, :, None]
    return mean, (d * d).mean(axis=(0, 2))


def normalize(x, mean, inv_std, out):
    """``out = (x - mean[c]) * inv_std[c]``."""
    xp = get_array_module(x)
    if xp is not numpy:
        from .cuda.batch_norm import normalize_gpu
        return normalize_gpu(x, mean, inv_std, out)
    xp.subtract(x, mean[None, :, None], out=out)
    out *= inv_std[None, :, None]
    return out


def batch_norm_backward(gy, y, inv_std, out):
    """``out = (gy - mean(gy) - mean(gy y) y) inv_std`` per channel (``out`` may be ``gy``)."""
    xp = get_array_module(gy)
    if xp is not numpy:
        from .cuda.batch_norm import batch_norm_backward_gpu
        return batch_norm_backward_gpu(gy, y, inv_std, out)
    mean_gy = gy.mean(axis=(0, 2))[None, :, None]
    mean_gy_y = (gy * y).mean(axis=(0, 2))[None, :, None]
    g = gy - mean_gy - mean_gy_y * y
    xp.multiply(g, inv_std[None, :, None], out=out)
    return out
