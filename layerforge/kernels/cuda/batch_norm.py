"""GPU bodies of :mod:`layerforge.kernels.batch_norm` (batch_norm.cu), on (N, C, S) views."""
from . import BLOCK, launch, run

# batch_norm.cu's block reductions assume BN_THREADS == BLOCK
_THREADS = BLOCK


def batch_stats_gpu(x, centred=None):
    """Per-channel mean and biased variance of a cupy (N, C, S) array; ``x - mean`` into ``centred`` if given."""
    import cupy

    x = cupy.ascontiguousarray(x)
    n, c, s = x.shape
    mean, var = cupy.empty(c, dtype=x.dtype), cupy.empty(c, dtype=x.dtype)
    run("batch_norm", "channel_mean_var", x.dtype, (c,), (_THREADS,), (x, mean, var, n, c, s))
    if centred is not None:
        normalize_gpu(x, mean, cupy.ones(c, dtype=x.dtype), centred)
    return mean, var


def normalize_gpu(x, mean, inv_std, out):
    """``out = (x - mean[c]) * inv_std[c]`` into the contiguous cupy array ``out``."""
    import cupy

    x = cupy.ascontiguousarray(x)
    mean, inv_std = (cupy.ascontiguousarray(a, dtype=x.dtype) for a in (mean, inv_std))
    n, c, s = x.shape
    launch("batch_norm", "normalize", x.dtype, x.size, (x, mean, inv_std, out, x.size, c, s))
    return out


def batch_norm_backward_gpu(gy, y, inv_std, out):
    """Batch-statistics gradient ``(gy - mean(gy) - mean(gy y) y) inv_std`` into ``out`` (may be ``gy``)."""
    import cupy

    gy, y = cupy.ascontiguousarray(gy), cupy.ascontiguousarray(y)
    inv_std = cupy.ascontiguousarray(inv_std, dtype=gy.dtype)
    n, c, s = gy.shape
    sum_gy, sum_gy_y = cupy.empty(c, dtype=gy.dtype), cupy.empty(c, dtype=gy.dtype)
    run("batch_norm", "channel_grad_sums", gy.dtype, (c,), (_THREADS,), (gy, y, sum_gy, sum_gy_y, n, c, s))
    launch("batch_norm", "batch_norm_backward", gy.dtype, gy.size,
           (gy, y, sum_gy, sum_gy_y, inv_std, out, gy.size, c, s, n * s))
    return out
