"""ReLU's forward, and its gradient read from its output (with a negative slope a >= 0, x > 0 exactly where y > 0),
for numpy and cupy:

    gx = gy where y > 0, else a gy

and Eltwise SUM followed by an in-place ReLU as one pass each way (layerforge.net.fusion).

The CPU runs compiled loops over flat pieces on the kernel threads. An output that is an input's memory (``gx`` is
``gy``: Caffe's in-place ReLU; or y's buffer, which the memory plan reuses) is written through that input: passed as a
second array that overlaps it, the loop would not be vectorised. cupy arrays take the same formulas as array
expressions.
"""
import numpy

from ..backend import data_address, get_array_module
from .threadpool import cpu_kernel, parallel_for


@cpu_kernel
def _relu_backward(gy, y, negative_slope, gx, into):
    # into: 0 gx apart, 1 gx is gy (Caffe's in place), 2 gx is y's memory (the memory plan reuses it once the ReLU
    # has read it); an output that overlaps an input as a second array is not vectorised, so it is written through
    # the input. The loop runs over the whole of the (piece's) flat arrays: one from lo to hi indexes with numba's
    # wraparound for negative positions, and is not vectorised either
    for i in range(gy.size):
        if into == 1:
            if not y[i] > 0:
                gy[i] = gy[i] * negative_slope
        elif into == 2:
            y[i] = gy[i] if y[i] > 0 else gy[i] * negative_slope
        else:
            gx[i] = gy[i] if y[i] > 0 else gy[i] * negative_slope


def relu_backward(gy, y, negative_slope, gx):
    """``gx`` = the gradient of a ReLU of ``negative_slope`` (>= 0) whose output is ``y``, from its top's ``gy``.

    Arrays of one shape; ``gx`` may be ``gy`` or ``y``. The same bits as numpy's ``gy * (y > 0)`` (slope 0: negative
    zeros where gy < 0) or ``where(y > 0, gy, gy * slope)`` in gy's dtype. Returns ``gx``.
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
    into = 1 if data_address(gx) == data_address(gy) else 2 if data_address(gx) == data_address(y) else 0
    parallel_for(flat_gy.size, lambda lo, hi: _relu_backward(flat_gy[lo:hi], flat_y[lo:hi], slope, flat_gx[lo:hi],
                                                             into), work=flat_gy.size)
    return gx


def relu_forward(x, negative_slope, out):
    """``out`` = ``max(x, 0)`` (slope 0: numpy's maximum, NaN kept) or ``where(x > 0, x, negative_slope x)``; numpy or
    cupy, ``out`` may be ``x``. Returns ``out``."""
    xp = get_array_module(x)
    if negative_slope == 0:
        return xp.maximum(x, 0, out=out)
    out[...] = xp.where(x > 0, x, x * negative_slope)
    return out


@cpu_kernel
def _sum_relu(a, b, negative_slope, out):
    for i in range(out.size):
        v = a[i] + b[i]
        if negative_slope == 0:  # numpy's maximum(v, 0): NaN stays, -0.0 becomes +0.0
            out[i] = v if v > 0 or v != v else 0.0
        else:
            out[i] = v if v > 0 else v * negative_slope


def sum_relu(a, b, negative_slope, out):
    """``out`` = the ReLU of ``negative_slope`` (>= 0) of ``a + b``: Eltwise SUM's forward and an in-place ReLU's, in
    one pass on the CPU, to the bits of the two (``out`` may not be ``a`` or ``b``). Returns ``out``."""
    xp = get_array_module(a)
    if xp is not numpy or not all(v.flags.c_contiguous for v in (a, b, out)):
        return relu_forward(xp.add(a, b, out=out), negative_slope, out)
    flat = [v.reshape(-1) for v in (a, b, out)]
    slope = out.dtype.type(negative_slope)
    parallel_for(flat[2].size, lambda lo, hi: _sum_relu(flat[0][lo:hi], flat[1][lo:hi], slope, flat[2][lo:hi]),
                 work=flat[2].size)
    return out


@cpu_kernel
def _relu_backward_to_both(gy, y, negative_slope, first, second, first_is_y, second_is_y):
    # a bottom's diff may be y's own memory (the memory plan reuses it once the ReLU has read it): written through y
    # then, for as a second array that overlaps y the loop is not vectorised
    for i in range(gy.size):
        g = gy[i]
        if not y[i] > 0:
            g = g * negative_slope
            gy[i] = g
        if first_is_y:
            y[i] = g
        else:
            first[i] = g
        if second_is_y:
            y[i] = g
        else:
            second[i] = g


def sum_relu_backward(gy, y, negative_slope, first, second):
    """The backward of :func:`sum_relu`: ``gy`` becomes the ReLU's input gradient (in place, as Caffe's in-place ReLU
    leaves its blob's diff) and is copied into ``first`` and ``second`` (the two bottoms' diffs; either may be None,
    or ``y``'s memory, which is read before it is written), in one pass on the CPU where one or both are wanted."""
    xp = get_array_module(gy)
    if first is None or second is None:  # one bottom's: the loop writes it twice, in one cache line
        first = second = second if first is None else first
    if xp is not numpy or first is None or not all(v.flags.c_contiguous for v in (gy, y, first, second)):
        relu_backward(gy, y, negative_slope, gy)
        for diff in {id(d): d for d in (first, second) if d is not None}.values():
            diff[...] = gy
        return
    flat = [v.reshape(-1) for v in (gy, y, first, second)]
    slope = gy.dtype.type(negative_slope)
    is_y = [data_address(d) == data_address(y) for d in (first, second)]
    parallel_for(flat[0].size, lambda lo, hi: _relu_backward_to_both(
        flat[0][lo:hi], flat[1][lo:hi], slope, flat[2][lo:hi], flat[3][lo:hi], *is_y), work=flat[0].size)
