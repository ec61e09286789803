"""ROIPooling: max pooling of each region of interest to a fixed grid (Fast R-CNN's layer, rbgirshick/caffe-fast-rcnn)."""
import math

import numpy

from ..backend import to_numpy
from ..errors import DataError, ShapeError
from .base import Field, Layer, register_layer


def round_half_away(values):
    """C's round(): halves away from zero (numpy's round takes halves to even)."""
    return numpy.sign(values) * numpy.floor(numpy.abs(values) + 0.5)


@register_layer("ROIPooling")
class ROIPooling(Layer):
    """y[r, c, i, j] = the max of bin (i, j) of region r of image n_r: a ``pooled_h`` x ``pooled_w`` grid.

    bottom[1] holds R regions ``[n, x1, y1, x2, y2]`` in image pixels (shape (R, 5) or (R, 5, 1, 1)); scaled by
    ``spatial_scale`` and rounded (C's round), the region covers rows y1..y2 and columns x1..x2 of bottom[0]
    (N, C, H, W), at least one of each; bin i spans rows [floor(i h / ph), ceil((i + 1) h / ph)) of it, clipped to
    the map. An empty bin gives 0. Shapes: -> (R, C, pooled_h, pooled_w). Backward: each bin's gradient goes to
    the element that was its max (summed where bins share one); the regions take no gradient.
    """

    param_blocks = {"roi_pooling": {
        "pooled_h": Field("int", 0, min=0, doc="rows of the output grid (> 0)"),
        "pooled_w": Field("int", 0, min=0, doc="columns of the output grid (> 0)"),
        "spatial_scale": Field("float", 1.0, doc="region coordinates x this = feature map coordinates (1 / stride)"),
    }}
    num_bottom = (2, 2)
    backward_reads = ()

    @classmethod
    def validate_params(cls, lp):
        for key in ("pooled_h", "pooled_w"):
            if getattr(lp.roi_pooling, key) <= 0:
                raise lp.error(f"{key} must be > 0", f"roi_pooling.{key}")

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def reshape(self, bottom, top):
        p, shape = self.layer_param.roi_pooling, bottom[0].shape
        if len(shape) != 4:
            raise ShapeError(f"ROIPooling needs a 4-D bottom (N, C, H, W), got shape {shape}", key="bottom")
        rois = bottom[1].shape
        if not rois or bottom[1].count != rois[0] * 5:
            raise ShapeError(f"the regions (bottom[1], shape {rois}) must hold 5 values each: [n, x1, y1, x2, y2]",
                             key="bottom")
        top[0].reshape(rois[0], shape[1], p.pooled_h, p.pooled_w)

    def _bins(self, rois, height, width):
        """Per region: its image and the row and column ranges of its bins (host ints, as the fork computes them)."""
        p, dtype = self.layer_param.roi_pooling, self.dtype.type
        corners = round_half_away(rois[:, 1:] * dtype(p.spatial_scale)).astype(numpy.int64)  # x1, y1, x2, y2
        images = rois[:, 0].astype(numpy.int64)
        out = []
        for (x1, y1, x2, y2) in corners:
            bin_h = dtype(max(y2 - y1 + 1, 1)) / dtype(p.pooled_h)
            bin_w = dtype(max(x2 - x1 + 1, 1)) / dtype(p.pooled_w)
            rows = [(min(max(math.floor(dtype(i) * bin_h) + y1, 0), height),
                     min(max(math.ceil(dtype(i + 1) * bin_h) + y1, 0), height)) for i in range(p.pooled_h)]
            cols = [(min(max(math.floor(dtype(j) * bin_w) + x1, 0), width),
                     min(max(math.ceil(dtype(j + 1) * bin_w) + x1, 0), width)) for j in range(p.pooled_w)]
            out.append((rows, cols))
        return images, out

    def forward(self, bottom, top):
        xp, x = self.xp, bottom[0].data
        n, c, height, width = x.shape
        rois = to_numpy(bottom[1].data).reshape(-1, 5).astype(self.dtype)
        images, bins = self._bins(rois, height, width)
        bad = (images < 0) | (images >= n)
        if bad.any():
            k = int(bad.argmax())
            raise DataError(f"layer '{self.name}' (ROIPooling): region {k} names image {rois[k, 0]:g}, outside the "
                            f"batch [0, {n})")
        y = top[0].data
        self.argmax = xp.full(y.shape, -1, dtype=xp.int64)
        for r, (rows, cols) in enumerate(bins):
            for i, (h0, h1) in enumerate(rows):
                for j, (w0, w1) in enumerate(cols):
                    if h1 <= h0 or w1 <= w0:
                        y[r, :, i, j] = 0
                        continue
                    window = x[images[r], :, h0:h1, w0:w1].reshape(c, -1)
                    k = window.argmax(axis=1)
                    y[r, :, i, j] = window[xp.arange(c), k]
                    self.argmax[r, :, i, j] = (h0 + k // (w1 - w0)) * width + w0 + k % (w1 - w0)
        self.images = xp.asarray(images)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        n, c, height, width = bottom[0].shape
        gx = bottom[0].diff
        gx[...] = 0
        planes = (self.images[:, None] * c + xp.arange(c)[None, :]) * (height * width)  # (R, C)
        flat = self.argmax + planes[:, :, None, None]
        hit = self.argmax >= 0
        xp.add.at(gx.reshape(-1), flat[hit], top[0].diff[hit])
