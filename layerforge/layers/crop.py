"""Crop: cut bottom[0] to bottom[1]'s size from ``axis`` on, at given offsets (Caffe's CropLayer)."""
from ..errors import ShapeError
from .base import Field, Layer, register_layer
from .layer_param import canonical_axis


@register_layer("Crop")
class Crop(Layer):
    """y = x[..., o_a : o_a + s_a, ...] for every axis a >= ``axis``, s = bottom[1].shape, o = ``offset``.

    ``offset``: none (0), one value for all cropped axes, or one per axis from ``axis`` on. Shapes: x (bottom 0)
    any; the reference bottom 1 gives the sizes; y = x.shape[:axis] + bottom[1].shape[axis:].
    Backward: gx is gy inside the window and 0 outside; bottom 1 takes no gradient.
    """

    param_blocks = {"crop": {
        "axis": Field("int", 2, doc="first axis to crop (negative counts from the end)"),
        "offset": Field("ints", [], min=0, doc="offsets: none (0), one for all, or one per cropped axis"),
    }}
    num_bottom = (2, 2)
    backward_reads = ()

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def reshape(self, bottom, top):
        p, shape, ref = self.layer_param.crop, bottom[0].shape, bottom[1].shape
        axis = canonical_axis(p.axis, len(shape), "crop.axis")
        if len(p.offset) > 1 and axis + len(p.offset) != len(shape):
            raise ShapeError(f"gives {len(p.offset)} offsets but axes {axis}..{len(shape) - 1} are cropped",
                             key="crop.offset")
        if len(ref) != len(shape):
            raise ShapeError(f"the reference bottom has {len(ref)} axes, the data {len(shape)}", key="bottom")
        self.window = []
        for a in range(len(shape)):
            if a < axis:
                self.window.append(slice(None))
                continue
            o = p.offset[0] if len(p.offset) == 1 else (p.offset[a - axis] if p.offset else 0)
            if o + ref[a] > shape[a]:
                raise ShapeError(f"the crop of axis {a} (offset {o}, size {ref[a]}) is out of bounds for size "
                                 f"{shape[a]}", key="crop.offset")
            self.window.append(slice(o, o + ref[a]))
        self.window = tuple(self.window)
        top[0].reshape(tuple(shape[:axis]) + tuple(ref[axis:]))

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data[self.window]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = 0
            bottom[0].diff[self.window] = top[0].diff
