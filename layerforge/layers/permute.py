"""Permute: reorder the axes of a blob (SSD's PermuteLayer, weiliu89/caffe branch ssd)."""
from ..errors import ShapeError
from .base import Field, Layer, register_layer


@register_layer("Permute")
class Permute(Layer):
    """y = x.transpose(order), the axes not named in ``order`` following in their own order.

    ``order: [0, 2, 3, 1]`` makes (N, C, H, W) into (N, H, W, C), as SSD does to its location and confidence
    maps before flattening them. Backward: gx = gy transposed back.
    """

    param_blocks = {"permute": {
        "order": Field("ints", [], min=0, doc="the new order of the axes (the missing ones follow in order)"),
    }}
    backward_reads = ()

    @classmethod
    def validate_params(cls, lp):
        order = lp.permute.order
        if len(set(order)) != len(order):
            raise lp.error(f"order {order} names an axis twice", "permute.order")

    def reshape(self, bottom, top):
        shape, order = bottom[0].shape, self.layer_param.permute.order
        if any(axis >= len(shape) for axis in order):
            raise ShapeError(f"order {order} names an axis the bottom (shape {shape}) does not have",
                             key="permute.order")
        self.order = tuple(order) + tuple(a for a in range(len(shape)) if a not in order)
        self.inverse = tuple(self.order.index(a) for a in range(len(shape)))
        top[0].reshape(tuple(shape[a] for a in self.order))

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data.transpose(self.order)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff.transpose(self.inverse)
