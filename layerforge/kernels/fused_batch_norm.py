"""The Scale (+ ReLU) half of a fused BatchNorm + Scale (+ ReLU), over (N, C, S) views, for numpy and cupy.

With ``x_norm`` BatchNorm's normalised input, gamma and beta Scale's per-channel blobs and a the ReLU's
negative slope::

    z = gamma_c x_norm + beta_c;   y = z (no ReLU)  or  y = max(z, 0) + a min(z, 0)

Backward, for a >= 0 (so y > 0 exactly where z > 0, and y is all the mask needs)::

    gz = gy where y > 0, else a gy;   g_beta_c += sum(gz);   g_gamma_c += sum(gz x_norm);   g_x_norm = gamma_c gz

Each step writes in place into the output (forward) or into gy (backward): no array of x's size is made but
the one ``gz * x_norm`` product of the gamma gradient. The sums are BatchNorm's ``channel_sum`` (a GEMV
against ones on the CPU), so cupy arrays run the same body on the device.
"""
from ..backend import get_array_module
from .batch_norm import channel_sum


def _per_channel(v):
    return v.reshape(1, -1, 1)


def scale_shift_relu(x_norm, gamma, beta, negative_slope, out):
    """``out`` (N, C, S) = ``gamma x_norm + beta``, then the ReLU of ``negative_slope`` (None: no ReLU)."""
    xp = get_array_module(x_norm)
    xp.multiply(x_norm, _per_channel(gamma), out=out)
    out += _per_channel(beta)
    if negative_slope == 0:
        xp.maximum(out, 0, out=out)
    elif negative_slope is not None:
        out[...] = xp.where(out > 0, out, out * negative_slope)
    return out


def scale_shift_relu_backward(gy, y, x_norm, gamma, negative_slope, g_gamma=None, g_beta=None):
    """Turn ``gy`` (N, C, S) into the gradient w.r.t. ``x_norm``, in place; add the per-channel gradients into
    ``g_gamma`` / ``g_beta`` (C,) where given. ``y`` is the forward output (read only with a ReLU)."""
    xp = get_array_module(gy)
    if negative_slope == 0:
        xp.multiply(gy, y > 0, out=gy)
    elif negative_slope is not None:
        gy[...] = xp.where(y > 0, gy, gy * negative_slope)
    if g_beta is not None:
        g_beta += channel_sum(gy)
    if g_gamma is not None:
        g_gamma += channel_sum(gy * x_norm)
    gy *= _per_channel(gamma)
    return gy
