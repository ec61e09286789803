"""BatchNorm's passes over (N, C, S) views (statistics per channel over N and S), for numpy and cupy.

numpy arrays run compiled loops (kernels.threadpool.cpu_kernel), one channel at a time, the channels split
over the kernel threads: a channel's N runs of S elements are summed in float64, in the same order for
every thread count. cupy arrays run batch_norm.cu (one block per channel for the sums).

The backward passes are shared with the fused BatchNorm + Scale (+ ReLU) of kernels.fused_batch_norm:
both need S1 = sum(gz) and S2 = sum(gz x_norm) per channel and then ``gx = a gz - b x_norm - c``.
"""
import numpy

from ..backend import get_array_module
from .threadpool import cpu_kernel, parallel_for


@cpu_kernel
def _channel_mean_var(x, lo, hi, mean, var):
    n, _, s = x.shape
    for c in range(lo, hi):
        total = 0.0
        for i in range(n):
            for k in range(s):
                total += x[i, c, k]
        mu = total / (n * s)
        squares = 0.0
        for i in range(n):
            for k in range(s):
                d = x[i, c, k] - mu
                squares += d * d
        mean[c] = mu
        var[c] = squares / (n * s)


@cpu_kernel
def _normalize(x, lo, hi, mean, inv_std, out):
    n, _, s = x.shape
    for c in range(lo, hi):
        mu, r = mean[c], inv_std[c]
        for i in range(n):
            for k in range(s):
                out[i, c, k] = (x[i, c, k] - mu) * r


@cpu_kernel
def _grad_sums(gy, y, relu, negative_slope, x_norm, lo, hi, s1, s2):
    # relu: gz = gy where y > 0, else negative_slope gy; otherwise gz = gy (y unused)
    n, _, s = gy.shape
    for c in range(lo, hi):
        a = 0.0
        b = 0.0
        for i in range(n):
            for k in range(s):
                g = gy[i, c, k]
                if relu and not y[i, c, k] > 0:
                    g = g * negative_slope
                a += g
                b += g * x_norm[i, c, k]
        s1[c] = a
        s2[c] = b


@cpu_kernel
def _input_grad(gy, y, relu, negative_slope, x_norm, coef_gz, coef_xn, shift, lo, hi, gx):
    n, _, s = gy.shape
    for c in range(lo, hi):
        a, b, d = coef_gz[c], coef_xn[c], shift[c]
        for i in range(n):
            for k in range(s):
                g = gy[i, c, k]
                if relu and not y[i, c, k] > 0:
                    g = g * negative_slope
                gx[i, c, k] = a * g - b * x_norm[i, c, k] - d


def _contiguous(a):
    return numpy.ascontiguousarray(a)


def _sweep_arguments(gy, y, negative_slope, x_norm):
    # the compiled sweeps' (gy, y, relu, slope, x_norm): y stands unused for gy where there is no ReLU
    gy, x_norm = _contiguous(gy), _contiguous(x_norm)
    y = gy if y is None else _contiguous(y)
    return gy, y, negative_slope is not None, float(negative_slope or 0.0), x_norm


def batch_stats(x, centred=None):
    """Per-channel mean and biased variance ``mean((x - mean)^2)`` of an (N, C, S) array.

    ``centred``: a contiguous buffer of x's shape that receives ``x - mean`` as a by-product.
    """
    xp = get_array_module(x)
    if xp is not numpy:
        from .cuda.batch_norm import batch_stats_gpu
        return batch_stats_gpu(x, centred)
    x = _contiguous(x)
    c = x.shape[1]
    mean, var = numpy.empty(c), numpy.empty(c)
    parallel_for(c, lambda lo, hi: _channel_mean_var(x, lo, hi, mean, var), work=x.size)
    mean, var = mean.astype(x.dtype), var.astype(x.dtype)
    if centred is not None:
        normalize(x, mean, numpy.ones(c, x.dtype), centred)
    return mean, var


def normalize(x, mean, inv_std, out):
    """``out = (x - mean[c]) * inv_std[c]`` for an (N, C, S) ``x``; ``out`` contiguous, may be ``x``."""
    xp = get_array_module(x)
    if xp is not numpy:
        from .cuda.batch_norm import normalize_gpu
        return normalize_gpu(x, mean, inv_std, out)
    x = _contiguous(x)
    mean, inv_std = (_contiguous(numpy.asarray(v, dtype=x.dtype)) for v in (mean, inv_std))
    parallel_for(x.shape[1], lambda lo, hi: _normalize(x, lo, hi, mean, inv_std, out), work=x.size)
    return out


def grad_sums(gy, y, negative_slope, x_norm):
    """Per-channel ``(S1, S2) = (sum(gz), sum(gz x_norm))`` of (N, C, S) arrays, with ``gz = gy`` when
    ``negative_slope`` is None, else the gradient behind a ReLU of that slope whose output is ``y``."""
    xp = get_array_module(gy)
    if xp is not numpy:
        from .cuda.fused_batch_norm import grad_sums_gpu
        return grad_sums_gpu(gy, gy if y is None else y, x_norm, negative_slope)
    gy, y, relu, slope, x_norm = _sweep_arguments(gy, y, negative_slope, x_norm)
    c = gy.shape[1]
    s1, s2 = numpy.empty(c), numpy.empty(c)
    parallel_for(c, lambda lo, hi: _grad_sums(gy, y, relu, slope, x_norm, lo, hi, s1, s2), work=gy.size)
    return s1.astype(gy.dtype), s2.astype(gy.dtype)


def input_grad(gy, y, negative_slope, x_norm, coef_gz, coef_xn, shift, gx):
    """``gx = coef_gz[c] gz - coef_xn[c] x_norm - shift[c]`` (``gz`` as in :func:`grad_sums`) on (N, C, S)
    arrays; ``gx`` contiguous, may be ``gy``."""
    if get_array_module(gy) is not numpy:
        from .cuda.fused_batch_norm import fused_backward_gpu
        return fused_backward_gpu(gy, gy if y is None else y, x_norm, coef_gz, coef_xn, shift, negative_slope, gx)
    gy, y, relu, slope, x_norm = _sweep_arguments(gy, y, negative_slope, x_norm)
    coefs = [_contiguous(numpy.asarray(v, dtype=gy.dtype)) for v in (coef_gz, coef_xn, shift)]
    parallel_for(gy.shape[1], lambda lo, hi: _input_grad(gy, y, relu, slope, x_norm, *coefs, lo, hi, gx),
                 work=gy.size)
    return gx


def batch_norm_backward(gy, y, inv_std, out):
    """``out = (gy - mean(gy) - mean(gy y) y) inv_std`` per channel (``out`` may be ``gy``)."""
    xp = get_array_module(gy)
    if xp is not numpy:
        from .cuda.batch_norm import batch_norm_backward_gpu
        return batch_norm_backward_gpu(gy, y, inv_std, out)
    m = y.shape[0] * y.shape[2]
    s1, s2 = grad_sums(gy, None, None, y)
    return input_grad(gy, None, None, y, inv_std, inv_std * s2 / m, inv_std * s1 / m, out)
