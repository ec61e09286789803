"""Layers that change a blob's shape but not its values: Flatten and Reshape (diffs pass straight through).

Both copy rather than alias the bottom (Caffe shares memory), so an in-place layer downstream can
never overwrite data a layer upstream still needs for its backward.
"""
import math

from ..errors import ShapeError
from .base import Field, Layer, register_layer


def _canonical_axis(axis, ndim, key, extra=0):
    # extra=1 lets an axis name the position just past the last one (Reshape's range ends)
    a = axis + ndim + extra if axis < 0 else axis
    if not 0 <= a < ndim + extra:
        raise ShapeError(f"{key} {axis} is out of range for a bottom of {ndim} axes", key=key)
    return a


class _ReshapeBase(Layer):
    backward_reads = ()

    @classmethod
    def validate_params(cls, lp):
        if lp.bottom and lp.top and lp.bottom[0] == lp.top[0]:
            raise lp.error(f"{cls.type} cannot compute in place: give the top a name other than '{lp.top[0]}'", "top")

    def top_shape(self, shape):
        raise NotImplementedError

    def reshape(self, bottom, top):
        top[0].reshape(self.top_shape(bottom[0].shape))

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff.reshape(bottom[0].shape)


@register_layer("Flatten")
class Flatten(_ReshapeBase):
    """Merges axes ``axis`` .. ``end_axis`` (inclusive) into one.

    (N, C, H, W) with axis=1, end_axis=-1 -> (N, C*H*W).
    """

    param_blocks = {"flatten": {
        "axis": Field("int", 1, doc="first axis to merge"),
        "end_axis": Field("int", -1, doc="last axis to merge (inclusive; negative counts from the end)"),
    }}

    def top_shape(self, shape):
        p = self.layer_param.flatten
        start = _canonical_axis(p.axis, len(shape), "flatten.axis")
        end = _canonical_axis(p.end_axis, len(shape), "flatten.end_axis")
        if end < start:
            raise ShapeError(f"end_axis {p.end_axis} comes before axis {p.axis} for bottom shape {tuple(shape)}",
                             key="flatten.end_axis")
        return tuple(shape[:start]) + (math.prod(shape[start:end + 1]),) + tuple(shape[end + 1:])


@register_layer("Reshape")
class Reshape(_ReshapeBase):
    """Replaces bottom axes ``[axis, axis + num_axes)`` by ``shape`` (Caffe's ReshapeLayer).

    In ``shape``, 0 copies the bottom dimension at the same position and one -1 is inferred so the
    element count stays the same: (N, 3, 8, 8) with shape [0, -1] -> (N, 192); with axis=1,
    num_axes=1, shape [1, 3] -> (N, 1, 3, 8, 8). ``num_axes`` -1 runs to the last axis.
    """

    param_blocks = {"reshape": {
        "shape": Field("dims", [], min=-1, doc="new dimensions: 0 copies the bottom's, one -1 is inferred"),
        "axis": Field("int", 0, doc="first bottom axis replaced (negative: counted from the end, -1 = past the last)"),
        "num_axes": Field("int", -1, min=-1, doc="how many bottom axes are replaced (-1: all from axis on)"),
    }}

    @classmethod
    def validate_params(cls, lp):
        super().validate_params(lp)
        if lp.reshape.shape.count(-1) > 1:
            raise lp.error(f"at most one dimension may be -1 (inferred), got {lp.reshape.shape}", "reshape.shape")

    def top_shape(self, shape):
        p = self.layer_param.reshape
        shape = tuple(shape)
        start = _canonical_axis(p.axis, len(shape), "reshape.axis", extra=1)
        end = len(shape) if p.num_axes == -1 else start + p.num_axes
        if end > len(shape):
            raise ShapeError(f"axis {p.axis} + num_axes {p.num_axes} exceeds the {len(shape)} axes of bottom shape "
                             f"{shape}", key="reshape.num_axes")
        dims = []
        for i, d in enumerate(p.shape):
            if d == 0:
                if start + i >= end:
                    raise ShapeError(f"shape {p.shape}: dimension {i} is 0 (copy) but the replaced axes of bottom "
                                     f"shape {shape} have no axis {start + i}", key="reshape.shape")
                d = shape[start + i]
            dims.append(d)
        new = shape[:start] + tuple(dims) + shape[end:]
        count = math.prod(shape)
        if -1 in dims:
            known = math.prod(d for d in new if d != -1)
            if known == 0 or count % known:
                raise ShapeError(f"cannot infer the -1 in shape {p.shape}: bottom shape {shape} has {count} elements, "
                                 f"not a multiple of {known}", key="reshape.shape")
            new = tuple(count // known if d == -1 else d for d in new)
        if math.prod(new) != count:
            raise ShapeError(f"shape {p.shape} gives top shape {new} with {math.prod(new)} elements, but bottom shape "
                             f"{shape} has {count}", key="reshape.shape")
        return new
