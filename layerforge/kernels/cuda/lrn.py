"""GPU bodies of :mod:`layerforge.kernels.lrn` (lrn.cu): LRN across channels."""
from . import launch, scalar


def lrn_forward_gpu(x, size, alpha_n, k, beta):
    """``(y, scale)`` for a cupy (N, C, H, W) batch."""
    import cupy

    x = cupy.ascontiguousarray(x)
    scale, y = cupy.empty_like(x), cupy.empty_like(x)
    n, c = x.shape[:2]
    t = x.dtype
    launch("lrn", "lrn_forward", t, x.size, (x, scale, y, x.size, c, x[0, 0].size, size,
                                             scalar(t, alpha_n), scalar(t, k), scalar(t, beta)))
    return y, scale


def lrn_backward_gpu(x, scale, gy, size, alpha_n, beta, gx):
    """Write the data gradient into the contiguous cupy array ``gx``."""
    import cupy

    x, scale, gy = (cupy.ascontiguousarray(a) for a in (x, scale, gy))
    c, t = x.shape[1], x.dtype
    launch("lrn", "lrn_backward", t, x.size, (x, scale, gy, gx, x.size, c, x[0, 0].size, size,
                                              scalar(t, alpha_n), scalar(t, beta)))
    return gx
