"""PriorBox: SSD's default boxes for one feature map (PriorBoxLayer, weiliu89/caffe branch ssd)."""
import math

import numpy

from .base import Field, Layer, register_layer


@register_layer("PriorBox")
class PriorBox(Layer):
    """The prior boxes of every cell of bottom[0] and their variances, as fractions of the image (bottom[1]).

    Cell (h, w) is centred at ``((w + offset) step_w, (h + offset) step_h)`` pixels, the steps being the image
    size over the map size unless ``step`` / ``step_h`` + ``step_w`` say; the image size is bottom[1]'s unless
    ``img_size`` / ``img_h`` + ``img_w`` say. Each cell has, for each ``min_size`` m (in pixels, truncated to
    an integer as the fork does): the m x m square; with ``max_size`` M the sqrt(m M) square; then for each
    aspect ratio r other than 1 (in the order given, each followed by 1/r with ``flip``, repeats dropped) the
    m sqrt(r) x m / sqrt(r) box. ``clip`` clamps the coordinates to [0, 1].

    OpenCV's fields: ``width`` / ``height`` list the boxes' sizes in pixels instead of min_size, max_size and
    aspect_ratio; ``offset_w`` / ``offset_h`` (pairs, instead of ``offset``) place each box once per pair of
    offsets, in that order. TextBoxes' fork repeats every box half a cell lower: its PriorBox layers are
    ``offset_w: [0.5, 0.5], offset_h: [0.5, 1.0]`` in these terms.

    Shapes: bottom[0] (N, C, H, W), bottom[1] (N, C', H', W') -> top (1, 2, H W P 4) with P priors per cell:
    top[0, 0] the boxes ``[xmin, ymin, xmax, ymax]`` cell by cell (row-major), top[0, 1] their variances (one
    value for all four coordinates, or four; default 0.1). No gradient.
    """

    param_blocks = {"prior_box": {
        "min_size": Field("floats", [], min=0.0, doc="box sizes in pixels (one square prior each); required"),
        "max_size": Field("floats", [], min=0.0, doc="one per min_size: adds the sqrt(min * max) square"),
        "aspect_ratio": Field("floats", [], min=0.0, doc="width / height ratios besides 1"),
        "flip": Field("bool", True, doc="also use 1 / r for every aspect ratio r"),
        "clip": Field("bool", False, doc="clamp the boxes to [0, 1]"),
        "variance": Field("floats", [], doc="one value for all four coordinates, or four (default 0.1)"),
        "img_size": Field("int", None, min=1, doc="the image's height and width (default: bottom[1]'s)"),
        "img_h": Field("int", None, min=1, doc="the image's height (with img_w)"),
        "img_w": Field("int", None, min=1, doc="the image's width (with img_h)"),
        "step": Field("float", None, doc="pixels between cell centres (default: image size / map size)"),
        "step_h": Field("float", None, doc="pixels between cell centres vertically (with step_w)"),
        "step_w": Field("float", None, doc="pixels between cell centres horizontally (with step_h)"),
        "offset": Field("float", 0.5, doc="centre of a cell, in cells from its top-left corner"),
        "offset_h": Field("floats", [], doc="OpenCV's: vertical offsets, one box per (offset_w, offset_h) pair"),
        "offset_w": Field("floats", [], doc="OpenCV's: horizontal offsets (as many as offset_h)"),
        "width": Field("floats", [], min=0.0, doc="OpenCV's: box widths in pixels (instead of min_size ...)"),
        "height": Field("floats", [], min=0.0, doc="OpenCV's: box heights in pixels (as many as width)"),
    }}
    num_bottom = (2, 2)
    has_backward = False
    backward_reads = ()

    @classmethod
    def validate_params(cls, lp):
        p = lp.prior_box
        if len(p.width) != len(p.height):
            raise lp.error(f"gives {len(p.width)} width for {len(p.height)} height", "prior_box.width")
        if p.width and (p.min_size or p.max_size or p.aspect_ratio):
            raise lp.error("give the boxes' width and height, or min_size (max_size, aspect_ratio), not both",
                           "prior_box.width")
        if len(p.offset_h) != len(p.offset_w) or (p.offset_h and p.given("offset")):
            raise lp.error("give offset, or as many offset_w as offset_h", "prior_box.offset_h")
        if not p.width and (not p.min_size or any(m <= 0 for m in p.min_size)):
            raise lp.error("give one or more min_size, each positive", "prior_box.min_size")
        if p.max_size and len(p.max_size) != len(p.min_size):
            raise lp.error(f"gives {len(p.max_size)} max_size for {len(p.min_size)} min_size", "prior_box.max_size")
        for m, big in zip(p.min_size, p.max_size):
            if big <= m:
                raise lp.error(f"max_size {big} must be greater than its min_size {m}", "prior_box.max_size")
        if len(p.variance) not in (0, 1, 4) or any(v <= 0 for v in p.variance):
            raise lp.error(f"give one or four positive variances, got {p.variance}", "prior_box.variance")
        for one, pair in (("img_size", ("img_h", "img_w")), ("step", ("step_h", "step_w"))):
            if any(getattr(p, k) is not None for k in pair):
                if getattr(p, one) is not None:
                    raise lp.error(f"give either {one} or {pair[0]}/{pair[1]}, not both", f"prior_box.{pair[0]}")
                if any(getattr(p, k) is None or getattr(p, k) <= 0 for k in pair):
                    raise lp.error(f"give both {pair[0]} and {pair[1]}, each positive", f"prior_box.{pair[0]}")
            elif getattr(p, one) is not None and getattr(p, one) <= 0:
                raise lp.error(f"{one} must be positive", f"prior_box.{one}")

    def layer_setup(self, bottom, top):
        p = self.layer_param.prior_box
        ratios = [1.0]
        for r in p.aspect_ratio:
            if all(abs(r - known) >= 1e-6 for known in ratios):
                ratios += [r, 1.0 / r] if p.flip else [r]
        sizes = []  # (width, height) of each prior of a cell, in pixels
        for k, size in enumerate(p.min_size):
            m = int(size)
            sizes.append((m, m))
            if p.max_size:
                side = math.sqrt(m * int(p.max_size[k]))
                sizes.append((side, side))
            sizes += [(m * math.sqrt(r), m / math.sqrt(r)) for r in ratios if abs(r - 1.0) >= 1e-6]
        if p.width:
            sizes = list(zip(p.width, p.height))
        # (box, offset) pairs: each box at each offset, in that order
        offsets = list(zip(p.offset_w, p.offset_h)) or [(p.offset, p.offset)]
        self.half_sizes = numpy.repeat(numpy.asarray(sizes, dtype=numpy.float64) / 2, len(offsets), axis=0)
        self.offsets = numpy.tile(numpy.asarray(offsets, dtype=numpy.float64), (len(sizes), 1))
        self.variance = p.variance or [0.1]

    def reshape(self, bottom, top):
        h, w = bottom[0].shape[2:4]
        top[0].reshape(1, 2, h * w * len(self.half_sizes) * 4)

    def forward(self, bottom, top):
        p, xp = self.layer_param.prior_box, self.xp
        h, w = bottom[0].shape[2:4]
        img_h, img_w = (p.img_h, p.img_w) if p.img_h else (p.img_size, p.img_size) if p.img_size else \
            bottom[1].shape[2:4]
        step_h, step_w = (p.step_h, p.step_w) if p.step_h else (p.step, p.step) if p.step else \
            (img_h / h, img_w / w)
        cells = numpy.stack(numpy.broadcast_arrays(numpy.arange(w)[None, :], numpy.arange(h)[:, None]), axis=-1)
        centers = (cells[:, :, None, :] + self.offsets) * numpy.asarray([step_w, step_h])  # (h, w, boxes, 2) x, y
        extent = numpy.asarray([img_w, img_h], dtype=numpy.float64)
        boxes = numpy.concatenate([(centers - self.half_sizes) / extent, (centers + self.half_sizes) / extent], -1)
        if p.clip:
            boxes = numpy.clip(boxes, 0, 1)
        out = top[0].data.reshape(2, -1, 4)
        out[0] = xp.asarray(boxes.reshape(-1, 4), dtype=out.dtype)
        out[1] = xp.asarray(numpy.asarray(self.variance, dtype=numpy.float64), dtype=out.dtype)
