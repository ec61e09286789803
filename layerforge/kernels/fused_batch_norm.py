"""Fused BatchNorm + Scale (+ ReLU) over (N, C, S) views, for numpy and cupy (cuda/fused_batch_norm.cu).

With ``x_norm`` BatchNorm's normalised input (``kernels.batch_norm`` computes it), s = 1 / sqrt(var + eps),
gamma and beta Scale's per-channel blobs and a >= 0 the ReLU's negative slope (None: no ReLU)::

    z = gamma_c x_norm + beta_c;   y = z (no ReLU)  or  y = max(z, 0) + a min(z, 0)

Backward: gz = gy where y > 0, else a gy (y > 0 exactly where z > 0, so y is all the mask needs). Every
gradient needs only two sums per channel, over N and S, S1 = sum(gz) and S2 = sum(gz x_norm)::

    g_beta_c += S1;   g_gamma_c += S2
    gx = gamma_c s_c (gz - S1 / m - x_norm S2 / m)     (batch statistics, m = N S)
    gx = gamma_c s_c gz                                 (global statistics)

so backward is one sweep for the sums and one for gx, where the layers one by one compute the gamma
gradient's sum, multiply gy by gamma, and BatchNorm then sums the same products again. On the GPU each
sweep is one kernel; on the CPU both are compiled loops over a channel at a time, the channels split
over the kernel threads, run one after the other on each channel (kernels.batch_norm.sums_and_input_grad, which the
unfused BatchNorm uses too), so that the second reads the channel's gy and x_norm from the core's cache: ResNet-50's
at batch 8 took 83 ms a step against 114 ms in two sweeps over the whole arrays (docs/performance.md). Replicas that
share the batch's statistics exchange the sums between the sweeps, so they keep the two sweeps.
"""
import numpy

from ..backend import get_array_module
from .batch_norm import (_channel_statistics, across, channel_statistics_arguments, grad_sums, input_grad, normalize,
                         sums_and_input_grad)
from .threadpool import cpu_kernel, parallel_for


@cpu_kernel
def _scale_shift_relu(x_norm, gamma, beta, relu, negative_slope, lo, hi, out):
    n, _, s = x_norm.shape
    for c in range(lo, hi):
        a, b = gamma[c], beta[c]
        for i in range(n):
            for k in range(s):
                z = a * x_norm[i, c, k] + b
                if relu and not z > 0:
                    z = z * negative_slope
                out[i, c, k] = z


def scale_shift_relu(x_norm, gamma, beta, negative_slope, out):
    """``out`` (N, C, S) = ``gamma x_norm + beta``, then the ReLU of ``negative_slope`` (None: no ReLU)."""
    xp = get_array_module(x_norm)
    if xp is not numpy:
        from .cuda.fused_batch_norm import scale_shift_relu_gpu
        return scale_shift_relu_gpu(x_norm, gamma, beta, negative_slope, out)
    x_norm = numpy.ascontiguousarray(x_norm)
    gamma, beta = (numpy.ascontiguousarray(v, dtype=x_norm.dtype) for v in (gamma, beta))
    relu, slope = negative_slope is not None, float(negative_slope or 0.0)
    parallel_for(x_norm.shape[1], lambda lo, hi: _scale_shift_relu(x_norm, gamma, beta, relu, slope, lo, hi, out),
                 work=out.size)
    return out


@cpu_kernel(reassociate=False)  # the bits of normalize, then scale_shift_relu: gamma (x - mean) inv_std as written
def _normalize_scale_shift_relu(x, mean, inv_std, gamma, beta, relu, negative_slope, lo, hi, x_norm, residual, out):
    # residual None (numba drops the branch): the ReLU's output into x; an array: z into x and into out the ReLU of
    # z + residual (kernels.relu._sum_relu's: NaN kept, -0.0 to +0.0 at slope 0)
    n, _, s = x.shape
    for c in range(lo, hi):
        mu, r, a, b = mean[c], inv_std[c], gamma[c], beta[c]
        for i in range(n):
            for k in range(s):
                v = (x[i, c, k] - mu) * r
                x_norm[i, c, k] = v
                z = a * v + b
                if residual is None:
                    if relu and not z > 0:
                        z = z * negative_slope
                    x[i, c, k] = z
                else:
                    x[i, c, k] = z
                    t = z + residual[i, c, k]
                    if negative_slope == 0:
                        out[i, c, k] = t if t > 0 or t != t else 0.0
                    else:
                        out[i, c, k] = t if t > 0 else t * negative_slope


@cpu_kernel(reassociate=False)  # inv_std as the BatchNorm layer's array expressions round it
def _channel_mean_var_inv_std(x, m, ratio, constants, c, shift, sums, mean64, var64, mean, var, inv_std):
    # channel c's batch statistics in x's dtype and 1 / sqrt(var + eps); constants: (eps, 1) in x's dtype
    _channel_statistics(x, m, ratio, c, c + 1, shift, sums, mean64, var64)
    mean[c], var[c] = mean64[c], var64[c]
    inv_std[c] = constants[1] / numpy.sqrt(var[c] + constants[0])


@cpu_kernel(reassociate=False)
def _batch_normalize_scale_shift_relu(x, m, ratio, constants, gamma, beta, relu, negative_slope, lo, hi, shift, sums,
                                      mean64, var64, mean, var, inv_std, x_norm, residual, out):
    # a channel's statistics, then its normalised and fused output while it is in the core's cache
    for c in range(lo, hi):
        _channel_mean_var_inv_std(x, m, ratio, constants, c, shift, sums, mean64, var64, mean, var, inv_std)
        _normalize_scale_shift_relu(x, mean, inv_std, gamma, beta, relu, negative_slope, c, c + 1, x_norm, residual,
                                    out)


def batch_normalize_scale_shift_relu(x, eps, gamma, beta, negative_slope, x_norm, residual=None, out=None):
    """The batch's statistics (:func:`kernels.batch_norm.batch_stats <layerforge.kernels.batch_norm.batch_stats>`)
    and :func:`normalize_scale_shift_relu` with ``inv_std = 1 / sqrt(var + eps)``, in one sweep of the channels on the
    host: each channel is normalised while it is in the core's cache after its sums, where the two steps read all of
    x twice from memory. The same bits as the two steps. ``x`` (N, C, S) numpy, contiguous; returns ``(mean, var)``
    (C,) in x's dtype.

    With ``residual`` (N, C, S, contiguous): ``gamma x_norm + beta`` is written into x (no ReLU there), and ``out``
    (contiguous, apart from x and residual) = the ReLU of ``negative_slope`` of ``x + residual``, each channel's in
    the same sweep (kernels.relu.sum_relu's bits): ResNet's join (Eltwise SUM + ReLU) after the BatchNorm + Scale of
    a block's last convolution, which then never reads x back from memory (the three in one loop)."""
    c, dtype = x.shape[1], x.dtype
    statistics = channel_statistics_arguments(x)  # (m, ratio, shift, sums, mean, var), the last two float64
    mean, var, inv_std = numpy.empty((3, c), dtype)
    constants = numpy.array([eps, 1], dtype)
    gamma, beta = (numpy.ascontiguousarray(v, dtype=dtype) for v in (gamma, beta))
    relu = negative_slope is not None and residual is None
    # (the sum's ReLU compares the slope with 0 in x's dtype, as sum_relu's loop)
    slope = dtype.type(negative_slope) if residual is not None else float(negative_slope or 0.0)
    parallel_for(c, lambda lo, hi: _batch_normalize_scale_shift_relu(
        x, *statistics[:2], constants, gamma, beta, relu, slope, lo, hi, *statistics[2:], mean, var, inv_std, x_norm,
        residual, out), work=x.size)
    return mean, var


def normalize_scale_shift_relu(x, mean, inv_std, gamma, beta, negative_slope, x_norm):
    """BatchNorm's ``x_norm = (x - mean) inv_std``, and then the fused forward's output from it in place of ``x``.

    The same bits as :func:`kernels.batch_norm.normalize <layerforge.kernels.batch_norm.normalize>` followed by
    :func:`scale_shift_relu` into x; on the CPU in one pass, which reads x once and never reads x_norm back.
    ``x`` (N, C, S) and ``x_norm`` contiguous and apart (in place, the compiled loop is vectorised where an output
    apart from x would overlap it); the per-channel vectors are (C,). Returns ``x``.
    """
    if get_array_module(x) is not numpy:
        normalize(x, mean, inv_std, x_norm)
        return scale_shift_relu(x_norm, gamma, beta, negative_slope, x)
    mean, inv_std, gamma, beta = (numpy.ascontiguousarray(v, dtype=x.dtype) for v in (mean, inv_std, gamma, beta))
    relu, slope = negative_slope is not None, float(negative_slope or 0.0)
    parallel_for(x.shape[1], lambda lo, hi: _normalize_scale_shift_relu(x, mean, inv_std, gamma, beta, relu, slope,
                                                                        lo, hi, x_norm, None, None), work=x.size)
    return x


def bn_scale_relu_backward(gy, y, x_norm, inv_std, gamma, negative_slope, batch_stats, g_gamma=None, g_beta=None,
                           gx=None, group=None, affine=None):
    """The gradients of the fused forward (module docstring) from ``gy`` (N, C, S).

    Args:
        gy, y, x_norm: the top's diff and data, BatchNorm's normalised input; (N, C, S) contiguous.
        inv_std, gamma: (C,); ``negative_slope``: the ReLU's (None: no ReLU).
        batch_stats: whether forward normalised with the batch's statistics (else the running ones).
        g_gamma, g_beta: (C,) diffs to add into, or None (not wanted).
        gx: (N, C, S) to write the input gradient into (may be ``gy``: in place), or None.
        group: replicas whose ``gy`` together are the batch's (kernels.batch_norm): gx's means are the whole
            batch's; g_gamma and g_beta get this replica's own sums, which the replicas' exchange averages.
        affine: the forward's ``(gamma, beta)``, where ``y`` is still the forward's output: the ReLU's mask is
            recomputed from x_norm on the host, and y is not read (kernels.batch_norm.grad_sums).
    """
    xp = get_array_module(gy)
    coef_gz = gamma * inv_std
    one_sweep = xp is numpy and gx is not None and (group is None or not batch_stats)  # gy and x_norm read once
    if one_sweep:
        s1, s2 = sums_and_input_grad(gy, y, negative_slope, x_norm, coef_gz, batch_stats, gx, affine)
    else:
        s1, s2 = grad_sums(gy, y, negative_slope, x_norm, affine)
    if g_beta is not None:
        g_beta += s1
    if g_gamma is not None:
        g_gamma += s2
    if one_sweep:
        return gx
    m = gy.shape[0] * gy.shape[2]
    if gx is None:
        if negative_slope is not None:  # the blob's diff shows the ReLU's gradient, as the layers one by one leave it
            zero = xp.zeros_like(s1)
            input_grad(gy, y, negative_slope, x_norm, xp.ones_like(s1), zero, zero, gy, affine)
        return None
    if group is not None and batch_stats:
        m *= group.count
        s1, s2 = across(group, s1, s2)
    coef_xn, shift = (coef_gz * s2 / m, coef_gz * s1 / m) if batch_stats else (xp.zeros_like(s1), xp.zeros_like(s1))
    return input_grad(gy, y, negative_slope, x_norm, coef_gz, coef_xn, shift, gx, affine)
