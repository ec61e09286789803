"""Reduction: sum, absolute sum, sum of squares or mean over the trailing axes (Caffe's ReductionLayer)."""
import math

from ..backend import get_array_module
from .base import Field, Layer, register_layer
from .layer_param import canonical_axis


@register_layer("Reduction")
class Reduction(Layer):
    """y = coeff * op(x[i, ...]) over all axes from ``axis`` on: x (d0, ..., dk) -> y (d0, ..., d_{axis-1}).

    op: SUM, ASUM (sum of |x|), SUMSQ (sum of x^2) or MEAN; ``axis`` 0 reduces everything to a scalar.
    Backward: gx = coeff gy times 1, sign(x), 2 x or 1/n (n the reduced count).
    """

    param_blocks = {"reduction": {
        "operation": Field("enum", "SUM", choices=("SUM", "ASUM", "SUMSQ", "MEAN"), doc="the reduction"),
        "axis": Field("int", 0, doc="first axis reduced (all later axes are too)"),
        "coeff": Field("float", 1.0, doc="multiplies the result"),
    }}
    backward_reads = ("bottom",)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        axis = canonical_axis(self.layer_param.reduction.axis, len(shape), "reduction.axis") if shape else 0
        self.outer, self.dim = math.prod(shape[:axis]), math.prod(shape[axis:])
        top[0].reshape(tuple(shape[:axis]))

    def forward(self, bottom, top):
        p = self.layer_param.reduction
        x = bottom[0].data.reshape(self.outer, self.dim)
        xp = get_array_module(x)
        op = {"SUM": lambda: x.sum(axis=1), "ASUM": lambda: xp.abs(x).sum(axis=1),
              "SUMSQ": lambda: (x * x).sum(axis=1), "MEAN": lambda: x.mean(axis=1)}[p.operation]
        top[0].data[...] = (p.coeff * op()).reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        p = self.layer_param.reduction
        x = bottom[0].data.reshape(self.outer, self.dim)
        g = p.coeff * top[0].diff.reshape(self.outer, 1)
        local = {"SUM": lambda: 1.0, "ASUM": lambda: get_array_module(x).sign(x), "SUMSQ": lambda: 2 * x,
                 "MEAN": lambda: 1.0 / self.dim}[p.operation]()
        bottom[0].diff[...] = (g * local * get_array_module(x).ones_like(x)).reshape(bottom[0].shape)
