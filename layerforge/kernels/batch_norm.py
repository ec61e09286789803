"""BatchNorm's passes over (N, C, S) views (statistics per channel over N and S), for numpy and cupy.

numpy arrays run compiled loops (kernels.threadpool.cpu_kernel), one channel at a time, the channels split
over the kernel threads: a channel's N runs of S elements are summed in float64, in the same order for
every thread count. cupy arrays run batch_norm.cu (one block per channel for the sums).

The backward passes are shared with the fused BatchNorm + Scale (+ ReLU) of kernels.fused_batch_norm:
both need S1 = sum(gz) and S2 = sum(gz x_norm) per channel and then ``gx = a gz - b x_norm - c``.

Replicas that each hold a share of one batch (``Net(split=...)``) pass a ``group``: any object with ``count``
(the replicas) and ``sum(values)`` (a float64 vector summed over the replicas, the same result for each, every
replica calling it equally often). The statistics and the backward's two sums are then the whole batch's; the
parameter gradients stay each replica's own, which the replicas' gradient exchange averages.
"""
import numpy

from ..backend import data_address, get_array_module, to_numpy
from .threadpool import cpu_kernel, parallel_for


@cpu_kernel
def _channel_moments(x, shift, lo, hi, sums, squares):
    # per channel, in float64: the sums of d = x - shift[c] and of d^2 over N and S (mean and variance in one pass)
    n, _, s = x.shape
    for c in range(lo, hi):
        k = shift[c]
        a = 0.0
        b = 0.0
        for i in range(n):
            for j in range(s):
                d = x[i, c, j] - k
                a += d
                b += d * d
        sums[c] = a
        squares[c] = b


@cpu_kernel(reassociate=False)  # the statistics' arithmetic as batch_stats' array expressions do it (a group's)
def _channel_statistics(x, m, ratio, lo, hi, shift, sums, mean, var):
    # per channel: float64 mean and biased variance from one pass, or from a second about the first's mean where the
    # mean is large against the spread (`ratio`); shift[c] is the shift of the pass kept
    for c in range(lo, hi):
        shift[c] = 0.0
        for _ in range(2):
            _channel_moments(x, shift, c, c + 1, sums[0], sums[1])
            offset = sums[0, c] / m
            mu = shift[c] + offset
            d = sums[1, c] / m - offset * offset
            v = 0.0 if d < 0.0 else d
            mean[c], var[c] = mu, v
            if shift[c] != 0.0 or not mu * mu > ratio * v:
                break
            shift[c] = mu


@cpu_kernel
def _normalize(x, lo, hi, mean, inv_std, out):
    n, _, s = x.shape
    for c in range(lo, hi):
        mu, r = mean[c], inv_std[c]
        for i in range(n):
            for k in range(s):
                out[i, c, k] = (x[i, c, k] - mu) * r


@cpu_kernel
def _grad_sums(gy, y, relu, negative_slope, x_norm, gamma, beta, affine, lo, hi, s1, s2):
    # relu: gz = gy where the ReLU's output is > 0, else negative_slope gy; otherwise gz = gy (y unused). affine: that
    # output's sign is gamma x_norm + beta's, computed as the forward did (y unread); else y's
    n, _, s = gy.shape
    for c in range(lo, hi):
        a = 0.0
        b = 0.0
        w, u = gamma[c], beta[c]
        for i in range(n):
            for k in range(s):
                g = gy[i, c, k]
                v = x_norm[i, c, k]
                if relu and not (w * v + u if affine else y[i, c, k]) > 0:
                    g = g * negative_slope
                a += g
                b += g * v
        s1[c] = a
        s2[c] = b


@cpu_kernel
def _input_grad(gy, y, relu, negative_slope, x_norm, gamma, beta, affine, coef_gz, coef_xn, shift, lo, hi, gx,
                in_place):
    # gz as in _grad_sums. in_place: gx is gy, written through gy itself; as a second array it overlaps, and the loop
    # is not vectorised
    n, _, s = gy.shape
    for c in range(lo, hi):
        a, b, d = coef_gz[c], coef_xn[c], shift[c]
        w, u = gamma[c], beta[c]
        for i in range(n):
            for k in range(s):
                g = gy[i, c, k]
                v = x_norm[i, c, k]
                if relu and not (w * v + u if affine else y[i, c, k]) > 0:
                    g = g * negative_slope
                r = a * g - b * v - d
                if in_place:
                    gy[i, c, k] = r
                else:
                    gx[i, c, k] = r


@cpu_kernel
def _sums_and_input_grad(gy, y, relu, negative_slope, x_norm, gamma, beta, affine, coef_gz, count, batch_stats, lo, hi,
                         sums, s1, s2, coef_xn, shift, gx, in_place):
    # _grad_sums and then _input_grad, a channel at a time, so that the second finds its gy and x_norm in the core's
    # cache. count: (m, 0) in gy's dtype; the sums (float64) and coefficients are rounded as the two passes round them
    for c in range(lo, hi):
        _grad_sums(gy, y, relu, negative_slope, x_norm, gamma, beta, affine, c, c + 1, sums[0], sums[1])
        s1[c], s2[c] = sums[0, c], sums[1, c]
        coef_xn[c], shift[c] = ((coef_gz[c] * s2[c] / count[0], coef_gz[c] * s1[c] / count[0]) if batch_stats
                                else (count[1], count[1]))
        _input_grad(gy, y, relu, negative_slope, x_norm, gamma, beta, affine, coef_gz, coef_xn, shift, c, c + 1, gx,
                    in_place)


def _contiguous(a):
    return numpy.ascontiguousarray(a)


def _sweep_arguments(gy, y, negative_slope, x_norm, affine):
    # the compiled sweeps' (gy, y, relu, slope, x_norm, gamma, beta, affine): y stands unused for gy where there is no
    # ReLU or the mask comes from x_norm, gamma and beta unused (ones) where it does not
    gy, x_norm = _contiguous(gy), _contiguous(x_norm)
    y = gy if y is None or affine is not None else _contiguous(y)
    gamma, beta = (numpy.ones(gy.shape[1], gy.dtype),) * 2 if affine is None else (
        _contiguous(numpy.asarray(v, dtype=gy.dtype)) for v in affine)
    return gy, y, negative_slope is not None, float(negative_slope or 0.0), x_norm, gamma, beta, affine is not None


# mean^2 / var above which one pass's variance, mean(x^2) - mean^2, is taken again about the mean: float64 sums lose
# about 1e-16 mean^2 to the difference, so below the ratio it keeps about 1e-12 of the variance
REFINE_RATIO = 1e4


def batch_stats(x, centred=None, group=None):
    """Per-channel mean and biased variance of an (N, C, S) array.

    On the host both come from one pass, the sums of x and of x^2 in float64, as ``var = mean(x^2) - mean(x)^2``
    (Caffe's BatchNorm takes that difference in the data's type); a channel whose mean is large against its spread
    (``REFINE_RATIO``) gets a second pass about its mean. The result depends on x alone, never on earlier batches.
    ``centred``: a contiguous buffer of x's shape that receives ``x - mean`` as a by-product.
    ``group``: replicas whose ``x`` together are the batch (module docstring): the whole batch's statistics, in one
    exchange (two where a second pass is needed: every replica sees the same sums, so all of them make it).
    """
    xp = get_array_module(x)
    if xp is not numpy and group is None:
        from .cuda.batch_norm import batch_stats_gpu
        return batch_stats_gpu(x, centred)
    if group is None:
        mean, var = _statistics_host(_contiguous(x))
    else:
        m = x.shape[0] * x.shape[2] * group.count
        shift = numpy.zeros(x.shape[1])
        for _ in range(2):
            sums, squares = across(group, *_channel_moments_host(x, shift))
            offset = sums / m
            mean, var = shift + offset, numpy.maximum(squares / m - offset * offset, 0.0)
            refine = mean * mean > REFINE_RATIO * var
            if shift.any() or not refine.any():
                break
            shift = numpy.where(refine, mean, 0.0)  # the others' second sums are their first
    mean, var = (xp.asarray(v, dtype=x.dtype) for v in (mean, var))
    if centred is not None:
        normalize(x, mean, xp.ones(x.shape[1], x.dtype), centred)
    return mean, var


def channel_statistics_arguments(x):
    """``(m, ratio, shift, sums, mean, var)`` for :func:`_channel_statistics` over the host array x (N, C, S): the
    count, :data:`REFINE_RATIO` and float64 scratch and results (the fused forward's sweep calls it too)."""
    c = x.shape[1]
    return float(x.shape[0] * x.shape[2]), REFINE_RATIO, numpy.empty(c), numpy.empty((2, c)), numpy.empty(c), \
        numpy.empty(c)


def _statistics_host(x):
    """float64 (C,) mean and variance of the host array x (N, C, S), channel by channel on the kernel threads."""
    m, ratio, shift, sums, mean, var = channel_statistics_arguments(x)
    parallel_for(x.shape[1], lambda lo, hi: _channel_statistics(x, m, ratio, lo, hi, shift, sums, mean, var),
                 work=x.size)
    return mean, var


def _channel_moments_host(x, shift):
    """float64 (C,) arrays on the host: per-channel sums of d = x - shift and of d^2 over N and S."""
    xp = get_array_module(x)
    if xp is not numpy:
        d = x.astype(xp.float64) - xp.asarray(shift)[None, :, None]
        return to_numpy(d.sum(axis=(0, 2))), to_numpy((d * d).sum(axis=(0, 2)))
    x = _contiguous(x)
    c = x.shape[1]
    sums, squares = numpy.empty(c), numpy.empty(c)
    shift = numpy.ascontiguousarray(shift)
    parallel_for(c, lambda lo, hi: _channel_moments(x, shift, lo, hi, sums, squares), work=x.size)
    return sums, squares


def across(group, *sums):
    """Per-channel sums (arrays of one dtype and module) added over the replicas of ``group``: one exchange."""
    xp = get_array_module(sums[0])
    flat = group.sum(numpy.concatenate([to_numpy(v).astype(numpy.float64) for v in sums]))
    return tuple(xp.asarray(part, dtype=v.dtype) for part, v in zip(numpy.split(flat, len(sums)), sums))


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


def grad_sums(gy, y, negative_slope, x_norm, affine=None):
    """Per-channel ``(S1, S2) = (sum(gz), sum(gz x_norm))`` of (N, C, S) arrays, with ``gz = gy`` when
    ``negative_slope`` is None, else the gradient behind a ReLU of that slope whose output is ``y``.

    ``affine``: ``(gamma, beta)``, (C,) each, with which that ReLU's input was computed from ``x_norm`` (in
    ``x_norm``'s dtype, as kernels.fused_batch_norm's forward does): on the host the ReLU's mask is then recomputed
    from x_norm, to the same bits, and ``y`` is not read (one array fewer in each sweep); a GPU reads ``y``.
    """
    xp = get_array_module(gy)
    if xp is not numpy:
        from .cuda.fused_batch_norm import grad_sums_gpu
        return grad_sums_gpu(gy, gy if y is None else y, x_norm, negative_slope)
    gy, *arguments = _sweep_arguments(gy, y, negative_slope, x_norm, affine)
    c = gy.shape[1]
    s1, s2 = numpy.empty(c), numpy.empty(c)
    parallel_for(c, lambda lo, hi: _grad_sums(gy, *arguments, lo, hi, s1, s2), work=gy.size)
    return s1.astype(gy.dtype), s2.astype(gy.dtype)


def input_grad(gy, y, negative_slope, x_norm, coef_gz, coef_xn, shift, gx, affine=None):
    """``gx = coef_gz[c] gz - coef_xn[c] x_norm - shift[c]`` (``gz`` and ``affine`` as in :func:`grad_sums`) on
    (N, C, S) arrays; ``gx`` contiguous, may be ``gy``."""
    if get_array_module(gy) is not numpy:
        from .cuda.fused_batch_norm import fused_backward_gpu
        return fused_backward_gpu(gy, gy if y is None else y, x_norm, coef_gz, coef_xn, shift, negative_slope, gx)
    gy, *arguments = _sweep_arguments(gy, y, negative_slope, x_norm, affine)
    coefs = [_contiguous(numpy.asarray(v, dtype=gy.dtype)) for v in (coef_gz, coef_xn, shift)]
    in_place = data_address(gx) == data_address(gy)
    parallel_for(gy.shape[1], lambda lo, hi: _input_grad(gy, *arguments, *coefs, lo, hi, gx, in_place),
                 work=gy.size)
    return gx


def sums_and_input_grad(gy, y, negative_slope, x_norm, coef_gz, batch_stats, gx, affine=None):
    """:func:`grad_sums` and then :func:`input_grad` with ``coef_xn = coef_gz S2 / m`` and ``shift = coef_gz S1 / m``
    (``batch_stats``; else both 0), m = N S, in one sweep over the channels on the host: each channel's gy and x_norm
    are read a second time from the core's cache rather than from memory (a channel of ResNet-50's at batch 8 is 0.2-1
    MiB of the two). The same bits as the two calls. Returns ``(S1, S2)`` in gy's dtype; ``gx`` may be ``gy``."""
    gy, *arguments = _sweep_arguments(gy, y, negative_slope, x_norm, affine)
    c = gy.shape[1]
    sums, (s1, s2, coef_xn, shift) = numpy.empty((2, c)), numpy.empty((4, c), gy.dtype)
    coef_gz = _contiguous(numpy.asarray(coef_gz, dtype=gy.dtype))
    count = numpy.array([gy.shape[0] * gy.shape[2], 0], gy.dtype)
    in_place = data_address(gx) == data_address(gy)
    parallel_for(c, lambda lo, hi: _sums_and_input_grad(gy, *arguments, coef_gz, count, batch_stats, lo, hi, sums, s1,
                                                        s2, coef_xn, shift, gx, in_place), work=gy.size)
    return s1, s2


def batch_norm_backward(gy, y, inv_std, out, group=None):
    """``out = (gy - mean(gy) - mean(gy y) y) inv_std`` per channel (``out`` may be ``gy``); the means over the
    whole batch of a ``group`` of replicas (module docstring)."""
    xp = get_array_module(gy)
    if xp is not numpy and group is None:
        from .cuda.batch_norm import batch_norm_backward_gpu
        return batch_norm_backward_gpu(gy, y, inv_std, out)
    if group is None:
        sums_and_input_grad(gy, None, None, y, inv_std, True, out)
        return out
    m = y.shape[0] * y.shape[2] * group.count
    s1, s2 = across(group, *grad_sums(gy, None, None, y))
    return input_grad(gy, None, None, y, inv_std, inv_std * s2 / m, inv_std * s1 / m, out)
