"""Weight fillers with Caffe's formulas (``filler.hpp``).

fan_in = count / shape[0] and fan_out = count / shape[1], as Caffe computes them for
(num_output, channels, kh, kw) and (num_output, inputs) weights.
"""
import math

import numpy

from . import rng


def fill(data, p):
    """Fill the array ``data`` in place as the filler ``p`` (a validated FILLER block) says."""
    shape = data.shape
    count = int(numpy.prod(shape)) if shape else 1
    fan_in = count / shape[0] if len(shape) >= 1 and shape[0] else count
    fan_out = count / shape[1] if len(shape) >= 2 and shape[1] else count
    n = {"FAN_IN": fan_in, "FAN_OUT": fan_out, "AVERAGE": (fan_in + fan_out) / 2.0}[p.variance_norm]
    g = rng.get_rng()
    kind = p.type
    if kind == "CONSTANT":
        values = numpy.full(shape, p.value)
    elif kind == "UNIFORM":
        values = g.uniform(p.min, p.max, size=shape)
    elif kind == "GAUSSIAN":
        values = g.normal(p.mean, p.std, size=shape)
        if p.sparse >= 0:
            # Caffe keeps each weight with probability sparse / num_outputs so a unit has ~sparse inputs
            num_outputs = shape[0] if shape else 1
            keep = g.random(size=shape) < min(1.0, p.sparse / num_outputs)
            values = values * keep
    elif kind == "XAVIER":
        scale = math.sqrt(3.0 / n)
        values = g.uniform(-scale, scale, size=shape)
    elif kind == "MSRA":
        values = g.normal(0.0, math.sqrt(2.0 / n), size=shape)
    elif kind == "BILINEAR":
        values = _bilinear(shape)
    else:
        raise AssertionError(kind)
    data[...] = _as_module_array(data, values)


def _bilinear(shape):
    # Caffe's upsampling kernel for a Deconvolution of factor f: kernel 2f - f % 2, same for every channel
    if len(shape) != 4 or shape[2] != shape[3]:
        raise ValueError(f"bilinear filler needs a square 4-D weight, got shape {tuple(shape)}")
    k = shape[3]
    f = math.ceil(k / 2.0)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    x = numpy.arange(k)
    w1 = 1 - numpy.abs(x / f - c)
    return numpy.broadcast_to(numpy.outer(w1, w1), shape)


def _as_module_array(data, values):
    from .backend import get_array_module
    xp = get_array_module(data)
    return xp.asarray(values, dtype=data.dtype)
