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
sweep is one kernel; numpy runs each as a few in-place passes (the sums as GEMVs against ones), the
elementwise passes split over images on the kernel threads (kernels.parallel).
"""
import numpy

from ..backend import get_array_module
from .batch_norm import channel_sum
from .parallel import parallel_for


def _per_channel(v):
    return v.reshape(1, -1, 1)


def scale_shift_relu(x_norm, gamma, beta, negative_slope, out):
    """``out`` (N, C, S) = ``gamma x_norm + beta``, then the ReLU of ``negative_slope`` (None: no ReLU)."""
    xp = get_array_module(x_norm)
    if xp is not numpy:
        from .cuda.fused_batch_norm import scale_shift_relu_gpu
        return scale_shift_relu_gpu(x_norm, gamma, beta, negative_slope, out)
    parallel_for(len(out), lambda lo, hi: _scale_shift_relu(x_norm[lo:hi], gamma, beta, negative_slope, out[lo:hi]),
                 work=out.size)
    return out


def _scale_shift_relu(x_norm, gamma, beta, negative_slope, out):
    numpy.multiply(x_norm, _per_channel(gamma), out=out)
    out += _per_channel(beta)
    if negative_slope == 0:
        numpy.maximum(out, 0, out=out)
    elif negative_slope is not None:
        out[...] = numpy.where(out > 0, out, out * negative_slope)


def bn_scale_relu_backward(gy, y, x_norm, inv_std, gamma, negative_slope, batch_stats, g_gamma=None, g_beta=None,
                           gx=None):
    """The gradients of the fused forward (module docstring) from ``gy`` (N, C, S).

    Args:
        gy, y, x_norm: the top's diff and data, BatchNorm's normalised input; (N, C, S) contiguous.
        inv_std, gamma: (C,); ``negative_slope``: the ReLU's (None: no ReLU).
        batch_stats: whether forward normalised with the batch's statistics (else the running ones).
        g_gamma, g_beta: (C,) diffs to add into, or None (not wanted).
        gx: (N, C, S) to write the input gradient into (may be ``gy``: in place), or None.
    """
    xp = get_array_module(gy)
    m = gy.shape[0] * gy.shape[2]
    if xp is not numpy:
        from .cuda.fused_batch_norm import fused_backward_gpu, grad_sums_gpu
        s1, s2 = grad_sums_gpu(gy, y, x_norm, negative_slope)
    else:
        prod = numpy.empty_like(gy)
        parallel_for(len(gy), lambda lo, hi: _relu_grad_and_product(gy[lo:hi], y[lo:hi], x_norm[lo:hi], negative_slope,
                                                                    prod[lo:hi]), work=gy.size)
        s1, s2 = channel_sum(gy), channel_sum(prod)
    if g_beta is not None:
        g_beta += s1
    if g_gamma is not None:
        g_gamma += s2
    if gx is None:
        return None
    coef_gz = gamma * inv_std
    coef_xn, shift = (coef_gz * s2 / m, coef_gz * s1 / m) if batch_stats else (xp.zeros_like(s1), xp.zeros_like(s1))
    if xp is not numpy:
        return fused_backward_gpu(gy, y, x_norm, coef_gz, coef_xn, shift, negative_slope, gx)
    parallel_for(len(gx), lambda lo, hi: _input_grad(gy[lo:hi], x_norm[lo:hi], coef_gz, coef_xn, shift, batch_stats,
                                                     prod[lo:hi], gx[lo:hi]), work=gx.size)
    return gx


def _relu_grad_and_product(gy, y, x_norm, negative_slope, prod):
    # gz, in gy's place (gx may be gy, and gy is read no more), and gz * x_norm for the second sum
    if negative_slope == 0:
        numpy.multiply(gy, y > 0, out=gy)
    elif negative_slope is not None:
        gy[...] = numpy.where(y > 0, gy, gy * negative_slope)
    numpy.multiply(gy, x_norm, out=prod)


def _input_grad(gz, x_norm, coef_gz, coef_xn, shift, batch_stats, scratch, gx):
    numpy.multiply(gz, _per_channel(coef_gz), out=gx)
    if batch_stats:
        numpy.multiply(x_norm, _per_channel(coef_xn), out=scratch)
        gx -= scratch
        gx -= _per_channel(shift)
