"""Upsample: max-unpooling through a pooling layer's mask (SegNet's and ENet's Caffe forks)."""
from ..backend import to_numpy
from ..errors import DataError, ShapeError
from .base import Field, Layer, register_layer


@register_layer("Upsample")
class Upsample(Layer):
    """Each value of bottom[0] goes to the place in a zero map that bottom[1], the mask top of a MAX Pooling
    layer, names: y[n, c].flat[mask[n, c, i]] = x[n, c].flat[i] (PyTorch's max_unpool2d).

    Output size: ``upsample_h`` x ``upsample_w``, or the bottom's size times ``scale`` (or ``scale_h`` /
    ``scale_w``), less one row / column with ``pad_out_h`` / ``pad_out_w`` (scale 2 only): the forks' rules.
    Shapes: x and mask (N, C, H, W) -> y (N, C, Hout, Wout). Backward: gx[i] = gy.flat[mask[i]]; the mask
    takes no gradient.
    """

    param_blocks = {"upsample": {
        "scale": Field("int", 2, min=2, doc="output size = bottom size x scale (both axes)"),
        "scale_h": Field("int", None, min=2, doc="vertical scale (with scale_w, instead of scale)"),
        "scale_w": Field("int", None, min=2, doc="horizontal scale (with scale_h, instead of scale)"),
        "pad_out_h": Field("bool", False, doc="one row fewer than scale_h x H (scale_h 2 only)"),
        "pad_out_w": Field("bool", False, doc="one column fewer than scale_w x W (scale_w 2 only)"),
        "upsample_h": Field("int", None, min=2, doc="the output height (with upsample_w; overrides the scales)"),
        "upsample_w": Field("int", None, min=2, doc="the output width (with upsample_h)"),
    }}
    num_bottom = (2, 2)
    backward_reads = ("bottom",)

    @classmethod
    def validate_params(cls, lp):
        p = lp.upsample
        if (p.upsample_h is None) != (p.upsample_w is None):
            raise lp.error("give both upsample_h and upsample_w", "upsample.upsample_h")
        if p.upsample_h is None:
            if (p.scale_h is None) != (p.scale_w is None) or (p.scale_h is not None and p.given("scale")):
                raise lp.error("give scale, or scale_h and scale_w", "upsample.scale_h")
            sh, sw = (p.scale_h, p.scale_w) if p.scale_h is not None else (p.scale, p.scale)
            for pad, s, key in ((p.pad_out_h, sh, "pad_out_h"), (p.pad_out_w, sw, "pad_out_w")):
                if pad and s != 2:
                    raise lp.error(f"{key} needs a scale of 2 (the output size is ill-defined otherwise)",
                                   f"upsample.{key}")

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def reshape(self, bottom, top):
        p, shape = self.layer_param.upsample, bottom[0].shape
        if len(shape) != 4 or bottom[1].shape != shape:
            raise ShapeError(f"needs a 4-D bottom and a mask of its shape, got {shape} and {bottom[1].shape}",
                             key="bottom")
        if p.upsample_h is not None:
            self.out_h, self.out_w = p.upsample_h, p.upsample_w
        else:
            sh, sw = (p.scale_h, p.scale_w) if p.scale_h is not None else (p.scale, p.scale)
            self.out_h, self.out_w = shape[2] * sh - int(p.pad_out_h), shape[3] * sw - int(p.pad_out_w)
        top[0].reshape(shape[0], shape[1], self.out_h, self.out_w)

    def _indices(self, bottom):
        """Flat indices into (N C, Hout Wout) of each bottom value, checked against the output size."""
        xp = self.xp
        n, c = bottom[0].shape[:2]
        mask = bottom[1].data.reshape(n * c, -1).astype(xp.int64)
        plane = self.out_h * self.out_w
        bad = (mask < 0) | (mask >= plane)
        if bool(to_numpy(bad.any())):
            k = int(to_numpy(bad.reshape(-1)).argmax())
            raise DataError(f"layer '{self.name}' (Upsample): mask value {int(to_numpy(mask.reshape(-1))[k])} at "
                            f"position {k} is outside the {self.out_h}x{self.out_w} output; the scale does not match "
                            f"the pooling that made the mask")
        return mask + xp.arange(n * c, dtype=xp.int64)[:, None] * plane

    def forward(self, bottom, top):
        y = top[0].data.reshape(-1)
        y[...] = 0
        y[self._indices(bottom).reshape(-1)] = bottom[0].data.reshape(-1)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff.reshape(-1)[self._indices(bottom)].reshape(bottom[0].shape)
