"""LRN across channels (Caffe's formula with its scale buffer): one entry point per pass for numpy and cupy.

``scale = k + alpha_n sum_{window} x^2`` over the ``size`` channels centred on each channel (clipped at
the ends), ``y = x scale^(-beta)``; backward
``gx = gy scale^(-beta) - 2 alpha_n beta x sum_{window} gy y / scale``. numpy arrays run compiled loops over each
image's channels (one pass that reads x and writes y and scale, where the strided xp bodies made ten passes over
temporaries) for the exponents :func:`negative_power` takes by square roots, and the strided xp bodies
(:func:`window_sum`, shared with the LRN layer's WITHIN_CHANNEL path) for any other; both split over images on the
kernel threads (kernels.threadpool) and give the same bits, each operation as the xp body orders it. cupy arrays run
lrn.cu (one thread per element).
"""
import numpy

from ..backend import get_array_module
from .threadpool import cpu_kernel, parallel_for


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
    if beta in _ROOT_POWERS and x.flags.c_contiguous and y.flags.c_contiguous:
        flat, kind = x.reshape(len(x), x.shape[1], -1), x.dtype.type
        parallel_for(len(x), lambda lo, hi: _compiled_forward(
            flat, size, kind(alpha_n), kind(k), _ROOT_POWERS[beta], kind(1), lo, hi, y.reshape(flat.shape),
            scale.reshape(flat.shape)), work=x.size)
        return y, scale
    parallel_for(len(x), lambda lo, hi: _across_forward(x[lo:hi], size, alpha_n, k, beta, y[lo:hi], scale[lo:hi]),
                 work=x.size)
    return y, scale


# the exponents negative_power takes by square roots, as the compiled bodies' code for them
_ROOT_POWERS = {0.75: 0, 0.5: 1, 1: 2}


@cpu_kernel(reassociate=False, ieee_division=True)
def _compiled_forward(x, size, alpha_n, k, power, one, lo, hi, y, scale):
    # images [lo, hi) of x (N, C, P): each channel's window summed in window_sum's order (the channel, then the
    # neighbours at distance 1, 2 ... below before above), the power as negative_power computes it
    _, c, p = x.shape
    half = (size - 1) // 2
    acc = numpy.empty(p, x.dtype)  # one channel's window sums: loops over the pixels, which vectorise
    for n in range(lo, hi):
        for ch in range(c):
            for j in range(p):
                acc[j] = x[n, ch, j] * x[n, ch, j]
            for d in range(1, half + 1):
                if ch - d >= 0:
                    for j in range(p):
                        acc[j] += x[n, ch - d, j] * x[n, ch - d, j]
                if ch + d < c:
                    for j in range(p):
                        acc[j] += x[n, ch + d, j] * x[n, ch + d, j]
            for j in range(p):
                v = x[n, ch, j]
                s = acc[j] * alpha_n + k
                scale[n, ch, j] = s
                if power == 0:  # negative_power's operations for beta 0.75, 0.5 and 1
                    r = numpy.sqrt(s)
                    q = one / (numpy.sqrt(r) * r)
                else:
                    q = one / (numpy.sqrt(s) if power == 1 else s)
                y[n, ch, j] = v * q


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
    if beta in _ROOT_POWERS and all(a.flags.c_contiguous for a in (x, scale, gy, gx)):
        shape, kind = (len(x), x.shape[1], x[0, 0].size), x.dtype.type
        parallel_for(len(x), lambda lo, hi: _compiled_backward(
            x.reshape(shape), scale.reshape(shape), gy.reshape(shape), size, kind(2 * alpha_n * beta),
            _ROOT_POWERS[beta], kind(1), lo, hi, gx.reshape(shape)), work=x.size)
        return gx
    parallel_for(len(x), lambda lo, hi: _across_backward(x[lo:hi], scale[lo:hi], gy[lo:hi], size, alpha_n, beta,
                                                         gx[lo:hi]), work=x.size)
    return gx


@cpu_kernel(reassociate=False, ieee_division=True)
def _compiled_backward(x, scale, gy, size, factor, power, one, lo, hi, gx):
    # images [lo, hi): t = gy x scale^-beta / scale for every channel of the image first (the window reads five
    # channels of it), then gx = gy scale^-beta - factor x (window sum of t), in _across_backward's order
    _, c, p = x.shape
    half = (size - 1) // 2
    t = numpy.empty((c, p), x.dtype)
    q = numpy.empty((c, p), x.dtype)  # scale^-beta, as in _compiled_forward
    for n in range(lo, hi):
        for ch in range(c):
            for j in range(p):
                s = scale[n, ch, j]
                if power == 0:
                    r = numpy.sqrt(s)
                    q[ch, j] = one / (numpy.sqrt(r) * r)
                else:
                    q[ch, j] = one / (numpy.sqrt(s) if power == 1 else s)
                t[ch, j] = gy[n, ch, j] * x[n, ch, j] * q[ch, j] / s
        for ch in range(c):
            acc = t[ch].copy()
            for d in range(1, half + 1):
                if ch - d >= 0:
                    acc += t[ch - d]
                if ch + d < c:
                    acc += t[ch + d]
            for j in range(p):
                ratio = acc[j] * x[n, ch, j] * factor
                gx[n, ch, j] = gy[n, ch, j] * q[ch, j] - ratio


def _across_backward(x, scale, gy, size, alpha_n, beta, gx):
    power = negative_power(numpy, scale, beta)
    ratio = window_sum(gy * x * power / scale, size, (1,))
    ratio *= x
    ratio *= 2 * alpha_n * beta
    numpy.multiply(gy, power, out=gx)
    gx -= ratio
