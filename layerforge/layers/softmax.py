"""Softmax over one axis, and the helpers SoftmaxWithLoss shares."""
from ..backend import get_array_module
from .base import Field, Layer, register_layer
from .layer_param import canonical_axis


def softmax(x, axis):
    """exp(x - max) / sum(exp(x - max)) along ``axis``; subtracting the max keeps exp from overflowing."""
    xp = get_array_module(x)
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@register_layer("Softmax")
class Softmax(Layer):
    """y_i = exp(x_i) / sum_j exp(x_j) along ``axis`` (default 1, the channels); y has x's shape.

    Backward: dx = y * (dy - sum_j dy_j y_j), the sum taken along the same axis. In place allowed.
    """

    param_blocks = {"softmax": {"axis": Field("int", 1, doc="axis the probabilities sum to 1 over")}}
    backward_reads = ("top",)

    def reshape(self, bottom, top):
        self.axis = canonical_axis(self.layer_param.softmax.axis, len(bottom[0].shape), "softmax.axis")
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = softmax(bottom[0].data, self.axis)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            y, gy = top[0].data, top[0].diff
            bottom[0].diff[...] = y * (gy - (gy * y).sum(axis=self.axis, keepdims=True))
