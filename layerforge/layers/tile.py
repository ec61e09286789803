"""Tile: repeat the block of axes from ``axis`` on, ``tiles`` times along ``axis`` (Caffe's TileLayer)."""
import math

from ..schema import REQUIRED
from .base import Field, Layer, register_layer
from .layer_param import canonical_axis


@register_layer("Tile")
class Tile(Layer):
    """y has x's shape with ``axis`` multiplied by ``tiles``: for each index before ``axis``, the block
    x[i, ...] is written ``tiles`` times one after another. Backward: gx = the sum of gy over the copies."""

    param_blocks = {"tile": {
        "axis": Field("int", 1, doc="the axis to tile along"),
        "tiles": Field("int", REQUIRED, min=1, doc="number of copies"),
    }}
    backward_reads = ()

    def reshape(self, bottom, top):
        shape = list(bottom[0].shape)
        axis = canonical_axis(self.layer_param.tile.axis, len(shape), "tile.axis")
        self.outer, self.inner = math.prod(shape[:axis]), math.prod(shape[axis:])
        shape[axis] *= self.layer_param.tile.tiles
        top[0].reshape(tuple(shape))

    def forward(self, bottom, top):
        tiles = self.layer_param.tile.tiles
        y = top[0].data.reshape(self.outer, tiles, self.inner)
        y[...] = bottom[0].data.reshape(self.outer, 1, self.inner)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            gy = top[0].diff.reshape(self.outer, self.layer_param.tile.tiles, self.inner)
            bottom[0].diff[...] = gy.sum(axis=1).reshape(bottom[0].shape)
