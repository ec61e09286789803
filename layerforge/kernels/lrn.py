"""LRN across channels (Caffe's formula with its scale buffer): one entry point per pass for numpy and cupy.

``scale = k + alpha_n sum_{window} x^2`` over the ``size`` channels centred on each channel (clipped at
the ends), ``y = x scale^(-beta)``; backward
``gx = gy scale^(-beta) - 2 alpha_n beta x sum_{window} gy y / scale``. numpy arrays run strided xp
bodies (:func:`window_sum`, shared with the LRN layer's WITHIN_CHANNEL path), split over images on the
kernel threads (kernels.threadpool); cupy arrays run lrn.cu
(one thread per element).
"""
import numpy

from ..backend import get_array_module
from .threadpool import parallel_for


def window_sum(a, n, axes):
    """Sum of ``a`` over a centred window of odd length ``n`` along each of ``axes`` (zeros outside)."""
    for axis in axes:
        out = a.copy()
        for d in range(1, (n - 1) // 2 + 1):
            lo, hi = [slice(None)] * a.ndim, [slice(None)] * a.ndim
            lo[axis], hi[axis] = slice(None, -d), slice(d, None)
            out[tuple(hi)] += a[tuple(lo)]
            out[tuple(lo)] += a[tuple(hi)]
        a = out
    return a


def negative_power(xp, s, beta):
    """``s ** -beta`` for s > 0; the usual exponents by square roots, which cost a fraction of a pow."""
    if beta == 0.75:
        r = xp.sqrt(s)
        out = xp.sqrt(r)
        out *= r
        return xp.reciprocal(out, out=out)
    if beta == 0.5:
        out = xp.sqrt(s)
        return xp.reciprocal(out, out=out)
    if beta == 1:
        return xp.reciprocal(s)
    return s ** -beta


def lrn_across_forward(x, size, alpha_n, k, beta, out=None):
    """``(y, scale)`` for an (N, C, H, W) batch (y written into ``out`` when given); ``alpha_n`` is alpha / size."""
    xp = get_array_module(x)
    if xp is not numpy:
        from .cuda.lrn import lrn_forward_gpu
        y, scale = lrn_forward_gpu(x, size, alpha_n, k, beta)
        if out is not None:
            out[...] = y
        return (y if out is None else out), scale
    scale = xp.empty_like(x)
    y = xp.empty_like(x) if out is None else out
    parallel_for(len(x), lambda lo, hi: _across_forward(x[lo:hi], size, alpha_n, k, beta, y[lo:hi], scale[lo:hi]),
                 work=x.size)
    return y, scale


def _across_forward(x, size, alpha_n, k, beta, y, scale):
    s = window_sum(x * x, size, (1,))
    s *= alpha_n
    s += k
    scale[...] = s
    numpy.multiply(x, negative_power(numpy, s, beta), out=y)


def lrn_across_backward(x, scale, gy, size, alpha_n, beta, gx):
    """Write the data gradient into ``gx`` from the forward's ``scale``."""
    xp = get_array_module(x)
    if xp is not numpy:
        from .cuda.lrn import lrn_backward_gpu
        return lrn_backward_gpu(x, scale, gy, size, alpha_n, beta, gx)
    parallel_for(len(x), lambda lo, hi: _across_backward(x[lo:hi], scale[lo:hi], gy[lo:hi], size, alpha_n, beta,
                                                         gx[lo:hi]), work=x.size)
    return gx


def _across_backward(x, scale, gy, size, alpha_n, beta, gx):
    power = negative_power(numpy, scale, beta)
    ratio = window_sum(gy * x * power / scale, size, (1,))
    ratio *= x
    ratio *= 2 * alpha_n * beta
    numpy.multiply(gy, power, out=gx)
    gx -= ratio
