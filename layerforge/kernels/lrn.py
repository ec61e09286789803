"""LRN across channels (Caffe's formula with its scale buffer): one entry point per pass for numpy and cupy.

``scale = k + alpha_n sum_{window} x^2`` over the ``size`` channels centred on each channel (clipped at
the ends), ``y = x scale^(-beta)``; backward
``gx = gy scale^(-beta) - 2 alpha_n beta x sum_{window} gy y / scale``. numpy arrays run the strided
xp bodies of :mod:`layerforge.layers.lrn`; cupy arrays run lrn.cu (one thread per element).
"""
import numpy

from ..backend import get_array_module


def lrn_across_forward(x, size, alpha_n, k, beta):
    """``(y, scale)`` for an (N, C, H, W) batch; ``alpha_n`` is alpha / size."""
    xp = get_array_module(x)
    if xp is not numpy:
        from .cuda.lrn import lrn_forward_gpu
        return lrn_forward_gpu(x, size, alpha_n, k, beta)
    from ..layers.lrn import negative_power, window_sum
    scale = window_sum(x * x, size, (1,))
    scale *= alpha_n
    scale += k
    return x * negative_power(xp, scale, beta), scale


def lrn_across_backward(x, scale, gy, size, alpha_n, beta, gx):
    """Write the data gradient into ``gx`` from the forward's ``scale``."""
    xp = get_array_module(x)
    if xp is not numpy:
        from .cuda.lrn import lrn_backward_gpu
        return lrn_backward_gpu(x, scale, gy, size, alpha_n, beta, gx)
    from ..layers.lrn import negative_power, window_sum
    power = negative_power(xp, scale, beta)
    ratio = window_sum(gy * x * power / scale, size, (1,))
    ratio *= x
    ratio *= 2 * alpha_n * beta
    xp.multiply(gy, power, out=gx)
    gx -= ratio
    return gx
