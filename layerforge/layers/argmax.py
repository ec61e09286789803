"""ArgMax: the indices (and optionally values) of the top-k entries (Caffe's ArgMaxLayer)."""
import math

from ..backend import get_array_module
from ..errors import ShapeError
from .base import Field, Layer, register_layer
from .layer_param import canonical_axis


@register_layer("ArgMax")
class ArgMax(Layer):
    """Indices of the ``top_k`` largest values, per item (all values after axis 0) or along ``axis``.

    Without ``axis``: x (N, ...) -> (N, 1, top_k) (at least 3 axes), or (N, 2, top_k) with
    ``out_max_val`` (indices, then values). With ``axis``: x's shape with ``top_k`` on that axis, holding
    the indices, or the values with ``out_max_val``. Ties go to the larger index, as Caffe's
    partial sort of (value, index) pairs orders them. No backward.
    """

    param_blocks = {"argmax": {
        "out_max_val": Field("bool", False, doc="also (or, with axis, only) output the values"),
        "top_k": Field("int", 1, min=1, doc="how many of the largest to output"),
        "axis": Field("int", None, doc="the axis to search (default: all values of each item)"),
    }}
    has_backward = False
    backward_reads = ()

    def reshape(self, bottom, top):
        p, shape = self.layer_param.argmax, bottom[0].shape
        if p.axis is None:
            dim = math.prod(shape[1:])
            top_shape = [1] * max(len(shape), 3)
            top_shape[0], top_shape[1], top_shape[2] = shape[0], 2 if p.out_max_val else 1, p.top_k
        else:
            self.axis = canonical_axis(p.axis, len(shape), "argmax.axis")
            dim = shape[self.axis]
            top_shape = list(shape)
            top_shape[self.axis] = p.top_k
        if p.top_k > dim:
            raise ShapeError(f"top_k {p.top_k} is more than the {dim} values to search", key="argmax.top_k")
        top[0].reshape(tuple(top_shape))

    def forward(self, bottom, top):
        p, x = self.layer_param.argmax, bottom[0].data
        xp = get_array_module(x)
        axis = 1 if p.axis is None else self.axis
        x = x.reshape(x.shape[0], -1) if p.axis is None else x
        dim = x.shape[axis]
        # a stable sort of the reversed values, descending: equal values keep the larger index first
        reversed_x = xp.flip(x, axis=axis)
        order = xp.argsort(-reversed_x, axis=axis, kind="stable")
        index = dim - 1 - xp.take(order, xp.arange(p.top_k), axis=axis)
        if p.axis is None:
            out = top[0].data.reshape(x.shape[0], -1, p.top_k)
            out[:, 0, :] = index
            if p.out_max_val:
                out[:, 1, :] = xp.take_along_axis(x, index, axis=1)
        else:
            top[0].data[...] = xp.take_along_axis(x, index, axis=axis) if p.out_max_val else index

    def backward(self, top, propagate_down, bottom):
        pass
