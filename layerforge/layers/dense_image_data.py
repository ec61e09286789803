"""DenseImageData: images with a label image each, for per-pixel labelling (the SegNet and ENet forks' data layer).

The source lists ``image label_image`` pairs. Each forward gives ``data`` (N, C, h, w), the images transformed
(mean, scale), and ``label`` (N, 1, h, w), the label images' values (class indices) unchanged. As in
alexgkendall/caffe-segnet, the label image is read as one grey channel and resized nearest-neighbour, and the
layer's own ``mirror`` and ``crop_height`` x ``crop_width`` flip and cut image and label together, at random in
both phases; the transform's own crop_size and mirror, which the fork cannot apply to both, are refused.
"""
import numpy

from ..data.batches import BatchStream
from ..data.images import DenseImageList
from ..data.transform import TRANSFORM, resolve_path
from ..schema import REQUIRED
from .base import Field, register_layer
from .data import COMMON, IMAGE_LIST, ImageData


class DenseStream(BatchStream):
    """A BatchStream of (image, label image) records, cut at one random window and flipped together.

    ``crop`` is (crop_height, crop_width) or None; ``mirror`` flips each pair with probability 1/2; the label
    images are ``factor`` times smaller than the images (ENet's label_divide_factor; never with a crop).
    """

    crop, mirror, factor = None, False, 1

    def out_hw(self):
        return self.crop or self.shape[1:]

    def label_hw(self):
        oh, ow = self.out_hw()
        return oh // self.factor, ow // self.factor

    def layout(self):
        n, (oh, ow) = self.batch_size, self.out_hw()
        return [((n, self.shape[0], oh, ow), self.dtype), ((n, 1) + self.label_hw(), numpy.uint8)]

    def plan(self, position):
        """``(items, None)``: per image ``(i, record index, h0, w0, flip)``, drawn from the seed and ``position``."""
        n, (_, h, w), (oh, ow) = self.batch_size, self.shape, self.out_hw()
        draw = numpy.random.default_rng([self.seed, 1, position])
        h0, w0 = draw.integers(0, h - oh + 1, size=n), draw.integers(0, w - ow + 1, size=n)
        flip = draw.integers(0, 2, size=n).astype(bool) if self.mirror else numpy.zeros(n, bool)
        items = zip(range(n), self.indices(position, n), h0.tolist(), w0.tolist(), flip.tolist())
        return list(items), None

    def fill(self, arrays, item):
        i, index, h0, w0, flip = item
        image, label = self.read(index)
        self.check(index, image)
        self.transform.crop_into(arrays[0][i], image, h0, w0, flip)
        self.transform.crop_into(arrays[1][i], label, h0, w0, flip)

    def finish(self, xp, arrays, _, outs):
        # the images arrive cut and flipped; the mean (of the cut size, as the fork requires) is neither
        n = self.batch_size
        self.transform.finish(xp, arrays[0], (numpy.zeros(n, int), numpy.zeros(n, int), numpy.zeros(n, bool)),
                              outs[0])
        if len(outs) > 1:
            outs[1][...] = arrays[1]


@register_layer("DenseImageData")
class DenseImageData(ImageData):
    """The SegNet fork's (alexgkendall/caffe-segnet) data layer: ``image label_image`` pairs from a list file.

    Paths are relative to ``root_folder``; a line holds two paths. Tops: ``data`` (N, C, h, w) in the layer's
    dtype, the images decoded by OpenCV (BGR, or grey with ``is_color: false``), resized bilinearly to
    new_height x new_width when both are set, then mean-subtracted and scaled by ``transform``; ``label``
    (N, 1, h, w), the label images' grey values (resized nearest-neighbour).
    ``mirror`` flips image and label together with probability 1/2, and crop_height x crop_width cuts both at
    one random window, in TRAIN and TEST alike as the fork does. Batches run on across the end of the list into
    the next pass, which ``shuffle`` reorders.
    """

    block = "dense_image_data"
    stream_class = DenseStream
    param_blocks = {
        "dense_image_data": dict(COMMON, **{
            "source": Field("str", REQUIRED, doc="the list file: one 'image_path label_image_path' per line"),
            "batch_size": Field("int", 1, min=1, doc="image pairs per batch"),
        }, **IMAGE_LIST, **{
            "mirror": Field("bool", False, doc="flip image and label left-right together with probability 1/2"),
            "crop_height": Field("int", 0, min=0, doc="cut image and label at one random window this high "
                                                      "(with crop_width)"),
            "crop_width": Field("int", 0, min=0, doc="cut image and label at one random window this wide "
                                                     "(with crop_height)"),
            "mean_file": Field("str", None, doc="refused (the fork does not read it); give transform.mean_file"),
            "label_divide_factor": Field("int", 1, min=1, doc="ENet's: read the label images at new_height and "
                                                              "new_width divided by this (no crop)"),
        }),
        "transform": TRANSFORM,
    }

    @classmethod
    def validate_params(cls, lp):
        super().validate_params(lp)
        cls.both_or_neither(lp, ("crop_height", "crop_width"))
        p, t = lp.dense_image_data, lp.transform
        if p.label_divide_factor > 1 and (not p.new_height or p.crop_height):
            raise lp.error("label_divide_factor needs new_height and new_width, and no crop_height / crop_width "
                           "(ENet's layer reads the label images at the new size divided by it)",
                           "dense_image_data.label_divide_factor")
        if p.mean_file:
            raise lp.error("the fork does not read dense_image_data.mean_file; give transform.mean_file",
                           "dense_image_data.mean_file")
        for key in ("crop_size", "mirror"):
            if getattr(t, key):
                raise lp.error(f"transform.{key} would cut or flip the image alone; use dense_image_data's "
                               "crop_height / crop_width and mirror", f"transform.{key}")

    def open_source(self, p):
        return DenseImageList(resolve_path(p.source), p.root_folder, p.new_height, p.new_width, p.is_color,
                              p.label_divide_factor)

    def cropped_shape(self, p, shape):
        if not p.crop_height:
            return shape
        if p.crop_height > shape[1] or p.crop_width > shape[2]:
            raise self.layer_param.error(f"crop {p.crop_height}x{p.crop_width} is larger than the images "
                                         f"({shape[1]}x{shape[2]})", "dense_image_data.crop_height")
        return (shape[0], p.crop_height, p.crop_width)

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        p = self.layer_param.dense_image_data
        self.stream.crop = (p.crop_height, p.crop_width) if p.crop_height else None
        self.stream.mirror, self.stream.factor = p.mirror, p.label_divide_factor

    def reshape(self, bottom, top):
        top[0].reshape(self.top_shape)
        if len(top) > 1:
            top[1].reshape((self.batch_size, 1) + self.stream.label_hw())
