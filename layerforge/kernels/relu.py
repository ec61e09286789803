"""ReLU's gradient read from its output, for numpy and cupy: with a negative slope a >= 0, x > 0 exactly where y > 0.

    gx = gy where y > 0, else a gy

The CPU runs a compiled loop over flat pieces on the kernel threads. In place (``gx`` is ``gy``: Caffe's in-place
ReLU) it writes through ``gy`` itself, and only where y <= 0; passed as a second array that overlaps ``gy``, the loop
would not be vectorised. cupy arrays take the same formula as array expressions.
"""
import numpy

from ..backend import get_array_module
from .threadpool import cpu_kernel, parallel_for


@cpu_kernel
def _relu_backward(gy, y, negative_slope, gx, in_place):
    # over the whole of the (piece's) flat arrays: a loop from lo to hi indexes with numba's wraparound for negative
    # positions, and is not vectorised
    for i in range(gy.size):
        if in_place:
            if not y[i] > 0:
                gy[i] = gy[i] * negative_slope
        else:
            gx[i] = gy[i] if y[i] > 0 else gy[i] * negative_slope


def relu_backward(gy, y, negative_slope, gx):
    """``gx`` = the gradient of a ReLU of ``negative_slope`` (>= 0) whose output is ``y``, from its top's ``gy``.

    Arrays of one shape; ``gx`` may be ``gy``. The same bits as numpy's ``gy * (y > 0)`` (slope 0: negative zeros
    where gy < 0) or ``where(y > 0, gy, gy * slope)`` in gy's dtype. Returns ``gx``.
    """
    xp = get_array_module(gy)
    if xp is not numpy or not (gy.flags.c_contiguous and y.flags.c_contiguous and gx.flags.c_contiguous):
        positive = y > 0
        if negative_slope == 0:
            xp.multiply(gy, positive, out=gx)
        else:
            gx[...] = xp.where(positive, gy, gy * negative_slope)
        return gx
    flat_gy, flat_y, flat_gx = gy.reshape(-1), y.reshape(-1), gx.reshape(-1)
    slope = gy.dtype.type(negative_slope)  # numpy multiplies by a Python float in gy's dtype
    in_place = gx.__array_interface__["data"][0] == gy.__array_interface__["data"][0]
    parallel_for(flat_gy.size, lambda lo, hi: _relu_backward(flat_gy[lo:hi], flat_y[lo:hi], slope, flat_gx[lo:hi],
                                                             in_place), work=flat_gy.size)
    return gx
