"""The SSD fork's image and box augmentation (util/im_transforms.cpp, util/sampler.cpp, data_transformer.cpp),
and the batches of the AnnotatedData layer.

One image of a batch goes through, in the fork's order:

1. ``distort_param``: random brightness, contrast, saturation and hue changes and a random channel order;
2. ``expand_param``: with probability ``prob``, the image is placed at a random spot of a canvas up to
   ``max_expand_ratio`` times its size, filled with the ``mean_value`` (so it becomes 0);
3. ``batch_sampler``: each sampler draws up to ``max_trials`` boxes of a random scale and aspect ratio and
   keeps those meeting its ``sample_constraint`` against the image's boxes (Jaccard overlap, coverage); one
   of all kept boxes, drawn uniformly, is cropped out;
4. ``resize_param``: WARP to height x width, FIT_SMALL_SIZE (the shorter side to its size, the aspect kept)
   or FIT_LARGE_SIZE_AND_PAD (the longer side, padded), with an interpolation drawn from ``interp_mode``;
5. ``noise_param``: filters and noise on the resized picture (decolorize, blur, histogram equalization, CLAHE,
   JPEG round trip, erosion, posterization, inversion, salt and pepper, HSV), in TRAIN and TEST alike;
6. ``crop_size`` (or ``crop_h`` x ``crop_w``): a random crop in TRAIN, centred in TEST, and in TRAIN with
   ``mirror`` a left-right flip with probability 1/2 (as layerforge's Data layer: never in TEST).

The boxes follow every step: projected into each crop, dropped when the ``emit_constraint`` says so (CENTER:
the box's centre must lie in the crop; MIN_OVERLAP: the crop must cover more than ``emit_overlap`` of the
box) or when nothing of them remains, mirrored. A box is a row of layerforge/data/annotations.py's
``BOX_COLUMNS``; corners are fractions of the image.

Where layerforge differs from the fork, deliberately: the fork re-encodes an encoded image as JPEG after each
of steps 1-3 (lossy, and only to hand it on in a Datum); here the decoded pixels go from step to step. The
fork distorts only encoded images and fills an expansion of a raw image with the byte 32; here raw and
encoded images are treated alike (the fork's noise too applies to encoded images only). ``noise_param.prob``,
which the fork never reads, is honoured when given. Each image's randomness comes from a stream of its own,
drawn from the layer's seed and the batch's read position, so a batch is a function of (seed, position)
whatever the number of decode workers.
"""
import math

import numpy

from ..errors import DataError
from ..kernels.bbox import bbox_coverage, bbox_size, clip_bbox, jaccard_overlap
from ..schema import Field
from .batches import BatchStream
from .transform import TRANSFORM

INTERP_MODES = ("LINEAR", "AREA", "NEAREST", "CUBIC", "LANCZOS4")
RESIZE_MODES = ("WARP", "FIT_SMALL_SIZE", "FIT_LARGE_SIZE_AND_PAD")
PAD_MODES = ("CONSTANT", "MIRRORED", "REPEAT_NEAREST")

RESIZE = {
    "prob": Field("float", 1.0, doc="kept for the fork's files; the fork resizes always"),
    "resize_mode": Field("enum", "WARP", choices=RESIZE_MODES, doc="how the image meets height x width"),
    "height": Field("int", 0, min=0, doc="output height"),
    "width": Field("int", 0, min=0, doc="output width"),
    "height_scale": Field("int", 0, min=0, doc="FIT_SMALL_SIZE: the height the boxes are scaled to"),
    "width_scale": Field("int", 0, min=0, doc="FIT_SMALL_SIZE: the width the boxes are scaled to"),
    "pad_mode": Field("enum", "CONSTANT", choices=PAD_MODES, doc="FIT_LARGE_SIZE_AND_PAD: how to pad"),
    "pad_value": Field("floats", [], doc="CONSTANT padding: one value, or one per channel"),
    "interp_mode": Field("strs", [], doc="interpolations drawn from uniformly (LINEAR, AREA, NEAREST, CUBIC, "
                                        "LANCZOS4); none: LINEAR"),
}
DISTORT = {
    "brightness_prob": Field("float", 0.0, min=0, max=1, doc="probability of a brightness change"),
    "brightness_delta": Field("float", 0.0, min=0, doc="added value drawn from [-delta, delta]"),
    "contrast_prob": Field("float", 0.0, min=0, max=1, doc="probability of a contrast change"),
    "contrast_lower": Field("float", 0.0, min=0, doc="lowest contrast factor"),
    "contrast_upper": Field("float", 0.0, min=0, doc="highest contrast factor"),
    "hue_prob": Field("float", 0.0, min=0, max=1, doc="probability of a hue change"),
    "hue_delta": Field("float", 0.0, min=0, doc="hue shift drawn from [-delta, delta] (OpenCV's 0..180 scale)"),
    "saturation_prob": Field("float", 0.0, min=0, max=1, doc="probability of a saturation change"),
    "saturation_lower": Field("float", 0.0, min=0, doc="lowest saturation factor"),
    "saturation_upper": Field("float", 0.0, min=0, doc="highest saturation factor"),
    "random_order_prob": Field("float", 0.0, min=0, max=1, doc="probability of shuffling the channels"),
}
EXPAND = {
    "prob": Field("float", 1.0, min=0, max=1, doc="probability of expanding"),
    "max_expand_ratio": Field("float", 1.0, min=1, doc="largest canvas side over the image's"),
}
SALT_PEPPER = {
    "fraction": Field("float", 0.0, min=0, max=1, doc="share of the pixels set to value"),
    "value": Field("floats", [], doc="the value of those pixels: one, or one per channel (0..255)"),
}
NOISE = {
    "prob": Field("float", None, min=0, max=1, doc="probability of applying the block (absent: always, as the fork, "
                                                   "which never reads it)"),
    "decolorize": Field("bool", False, doc="grey in all three channels"),
    "gauss_blur": Field("bool", False, doc="7 x 7 Gaussian blur, sigma 1.5"),
    "hist_eq": Field("bool", False, doc="equalize the histogram of the luma (Y of YCrCb)"),
    "clahe": Field("bool", False, doc="CLAHE (clip limit 4, 8 x 8 tiles) on the luma"),
    "jpeg": Field("float", -1.0, max=100, doc="JPEG round trip at this quality (<= 0: none)"),
    "erode": Field("bool", False, doc="erosion by a 3 x 3 ellipse"),
    "posterize": Field("bool", False, doc="quantize each value to the middle of its 64-wide bin"),
    "inverse": Field("bool", False, doc="255 - value"),
    "saltpepper": Field("bool", False, doc="set saltpepper_param.fraction of the pixels to its value"),
    "saltpepper_param": Field(SALT_PEPPER, None, doc="the salt-and-pepper pixels"),
    "convert_to_hsv": Field("bool", False, doc="hand on the HSV image (OpenCV's 8-bit scale)"),
    "convert_to_lab": Field("bool", False, doc="refused: the fork makes a float image its transformer rejects"),
}
EMIT = {
    "emit_type": Field("enum", "CENTER", choices=("CENTER", "MIN_OVERLAP"), doc="which boxes a crop keeps"),
    "emit_overlap": Field("float", None, doc="MIN_OVERLAP: the share of the box the crop must cover"),
}
ANNOTATED_TRANSFORM = dict(TRANSFORM, **{
    "crop_h": Field("int", 0, min=0, doc="crop height (crop_size overrides)"),
    "crop_w": Field("int", 0, min=0, doc="crop width (crop_size overrides)"),
    "resize_param": Field(RESIZE, None, doc="resize each image (after distortion, expansion and sampling)"),
    "distort_param": Field(DISTORT, None, doc="photometric distortions"),
    "expand_param": Field(EXPAND, None, doc="zoom out onto a larger canvas"),
    "noise_param": Field(NOISE, None, doc="noise and filters (after resizing, before the crop)"),
    "emit_constraint": Field(EMIT, None, doc="which boxes a crop keeps"),
})

SAMPLER = {
    "min_scale": Field("float", 1.0, doc="smallest side of a sample, as a fraction of the image's"),
    "max_scale": Field("float", 1.0, doc="largest side of a sample"),
    "min_aspect_ratio": Field("float", 1.0, doc="smallest width / height"),
    "max_aspect_ratio": Field("float", 1.0, doc="largest width / height"),
}
SAMPLE_CONSTRAINT = {name: Field("float", None, doc=doc) for name, doc in (
    ("min_jaccard_overlap", "some box overlaps the sample at least this much"),
    ("max_jaccard_overlap", "some box overlaps the sample at most this much"),
    ("min_sample_coverage", "some box covers at least this share of the sample"),
    ("max_sample_coverage", "some box covers at most this share of the sample"),
    ("min_object_coverage", "the sample covers at least this share of some box"),
    ("max_object_coverage", "the sample covers at most this share of some box"))}
BATCH_SAMPLER = {
    "use_original_image": Field("bool", True, doc="sample from the whole image (false: this sampler is off)"),
    "sampler": Field(SAMPLER, None, doc="the scale and aspect ratio ranges"),
    "sample_constraint": Field(SAMPLE_CONSTRAINT, None, doc="when a sample is kept"),
    "max_sample": Field("int", None, min=0, doc="stop after this many kept samples"),
    "max_trials": Field("int", 100, min=0, doc="samples drawn at most"),
}

UNIT = numpy.array([0, 0, 1, 1], numpy.float32)


def check_params(t, error):
    """One-line errors (``error(message, key)``) for a transform block the fork would refuse or misread."""
    resize = t.resize_param
    if t.given("resize_param") and (resize.height <= 0 or resize.width <= 0):
        raise error("resize_param needs height and width", "transform.resize_param.height")
    for mode in resize.interp_mode:
        if mode.upper() not in INTERP_MODES:
            raise error(f"unknown interp_mode {mode!r}; one of {', '.join(INTERP_MODES)}",
                        "transform.resize_param.interp_mode")
    if t.given("expand_param") and t.expand_param.max_expand_ratio <= 1:
        raise error("expand_param.max_expand_ratio must be above 1", "transform.expand_param.max_expand_ratio")
    if t.given("expand_param") and t.mean_file:
        raise error("expand_param fills the canvas with mean_value; a mean_file cannot follow an expanded image "
                    "(the fork requires it to have the expanded size)", "transform.mean_file")
    if t.given("emit_constraint") and t.emit_constraint.emit_type == "MIN_OVERLAP" \
            and t.emit_constraint.emit_overlap is None:
        raise error("emit_type MIN_OVERLAP needs emit_overlap", "transform.emit_constraint.emit_overlap")
    for lower, upper in (("contrast_lower", "contrast_upper"), ("saturation_lower", "saturation_upper")):
        if t.given("distort_param") and getattr(t.distort_param, upper) < getattr(t.distort_param, lower):
            raise error(f"{upper} must be >= {lower}", f"transform.distort_param.{upper}")
    if t.given("noise_param"):
        check_noise(t.noise_param, error)


def check_noise(p, error):
    """One-line errors for a ``noise_param`` the fork would crash on or misread."""
    key = "transform.noise_param"
    if p.convert_to_lab:
        raise error("convert_to_lab is not supported: the fork's ApplyNoise makes a float Lab image that its "
                    "DataTransformer then refuses (it needs 8-bit pixels)", f"{key}.convert_to_lab")
    values = p.saltpepper_param.value
    if len(values) not in (0, 1, 3):
        raise error(f"saltpepper_param.value takes 1 or 3 values (one per channel), got {len(values)}",
                    f"{key}.saltpepper_param.value")
    if any(not 0 <= v <= 255 for v in values):
        raise error(f"saltpepper_param.value must lie in [0, 255], got {list(values)}",
                    f"{key}.saltpepper_param.value")
    if p.saltpepper and not values:
        raise error("saltpepper needs saltpepper_param.value (the fork reads past an empty list)",
                    f"{key}.saltpepper_param.value")


def check_sampler(s, error, key):
    """One-line errors for a batch_sampler the fork's CHECKs refuse."""
    p = s.sampler
    if not 0 < p.min_scale <= p.max_scale <= 1:
        raise error(f"sampler scales must satisfy 0 < min_scale <= max_scale <= 1, got {p.min_scale}, {p.max_scale}",
                    f"{key}.sampler.min_scale")
    if not 0 < p.min_aspect_ratio <= p.max_aspect_ratio < math.inf:
        raise error("sampler aspect ratios must satisfy 0 < min_aspect_ratio <= max_aspect_ratio, got "
                    f"{p.min_aspect_ratio}, {p.max_aspect_ratio}", f"{key}.sampler.min_aspect_ratio")


# -- boxes ------------------------------------------------------------------------------------------------

def project(crop, boxes):
    """``(boxes in the crop's coordinates, clipped; kept)`` for corner boxes (k, 4) and a crop box (4,): the
    fork's ProjectBBox. A box that does not reach into the crop, or has nothing left after clipping, is not
    kept."""
    inside = ~((boxes[:, 0] >= crop[2]) | (boxes[:, 2] <= crop[0]) | (boxes[:, 1] >= crop[3]) |
               (boxes[:, 3] <= crop[1]))
    size = numpy.array([crop[2] - crop[0], crop[3] - crop[1]] * 2, numpy.float32)
    projected = clip_bbox((boxes - numpy.concatenate([crop[:2], crop[:2]])) / size)
    return projected, inside & (bbox_size(projected) > 0)


def meet_emit(crop, boxes, emit):
    """(k,) bool: the boxes the ``emit_constraint`` lets a crop keep."""
    if emit.emit_type == "CENTER":
        cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
        return (cx >= crop[0]) & (cx <= crop[2]) & (cy >= crop[1]) & (cy <= crop[3])
    return bbox_coverage(boxes, crop[None]) > emit.emit_overlap


def transform_boxes(boxes, crop, emit=None, mirror=False):
    """Box rows (k, 7) seen through ``crop`` (4,): kept by the ``emit`` constraint (when given) and by
    :func:`project`, projected, mirrored: the fork's TransformAnnotation."""
    corners = boxes[:, 2:6]
    keep = meet_emit(crop, corners, emit) if emit is not None else numpy.ones(len(boxes), bool)
    projected, inside = project(crop, corners)
    keep &= inside
    out = boxes[keep].copy()
    out[:, 2:6] = projected[keep]
    if mirror:
        out[:, [2, 4]] = 1 - out[:, [4, 2]]
    return out


def satisfies(samples, boxes, constraint):
    """(T,) bool: which sampled boxes (T, 4) meet a sample_constraint against the image's boxes (k, 4): the fork's
    SatisfySampleConstraint. Its loop over the boxes keeps the flag of the first kind of test it runs (Jaccard
    overlap, else sample coverage, else object coverage) once any box passes that one, whatever the later
    kinds say: so a sample is kept when some box meets the limits of that first kind, as here."""
    for kind, low, high in (("jaccard", "min_jaccard_overlap", "max_jaccard_overlap"),
                            ("sample", "min_sample_coverage", "max_sample_coverage"),
                            ("object", "min_object_coverage", "max_object_coverage")):
        low, high = getattr(constraint, low), getattr(constraint, high)
        if low is None and high is None:
            continue
        a, b = samples[:, None], boxes[None]
        values = jaccard_overlap(a, b) if kind == "jaccard" else bbox_coverage(a, b) if kind == "sample" \
            else bbox_coverage(b, a)
        ok = numpy.ones(values.shape, bool)
        if low is not None:
            ok &= values >= low
        if high is not None:
            ok &= values <= high
        return ok.any(axis=1)
    return numpy.ones(len(samples), bool)


def sample_boxes(sampler, count, r):
    """``count`` boxes (count, 4) of random scale and aspect ratio at random places in the unit square: the fork's
    SampleBBox, drawn at once."""
    scale = r.uniform(sampler.min_scale, sampler.max_scale, count)
    aspect = numpy.clip(r.uniform(sampler.min_aspect_ratio, sampler.max_aspect_ratio, count), scale ** 2,
                        1 / scale ** 2)
    width, height = scale * numpy.sqrt(aspect), scale / numpy.sqrt(aspect)
    x = r.uniform(0, 1, count) * numpy.maximum(0, 1 - width)  # rounding: 1 - width may be -eps
    y = r.uniform(0, 1, count) * numpy.maximum(0, 1 - height)
    return numpy.stack([x, y, x + width, y + height], axis=1).astype(numpy.float32)


def batch_samples(boxes, samplers, r):
    """The boxes the ``batch_sampler`` list keeps for an image with corner boxes (k, 4): the fork's
    GenerateBatchSamples (each sampler's first ``max_sample`` of ``max_trials`` samples that meet its
    constraint)."""
    kept = []
    for s in samplers:
        if not s.use_original_image or s.max_trials == 0:
            continue
        samples = sample_boxes(s.sampler, s.max_trials, r)  # located in the unit box: the whole image
        good = samples[satisfies(samples, boxes, s.sample_constraint)]
        kept += list(good if s.max_sample is None else good[:s.max_sample])
    return kept


# -- pixels (H, W, C uint8, as OpenCV holds them) ---------------------------------------------------------

def _convert(image, alpha=1.0, beta=0.0):
    """OpenCV's convertTo for uint8: round(alpha x + beta), saturated to 0..255."""
    return numpy.clip(numpy.rint(image.astype(numpy.float32) * numpy.float32(alpha) + numpy.float32(beta)),
                      0, 255).astype(numpy.uint8)


def _hsv_channel(image, channel, alpha, beta):
    import cv2
    hsv = cv2.cvtColor(image, cv2.COLOR_BGR2HSV)
    hsv[:, :, channel] = _convert(hsv[:, :, channel], alpha, beta)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)


def distort(image, p, r):
    """The fork's ApplyDistort: brightness, then contrast before or after saturation and hue (a coin decides),
    then the channel order; each with its probability."""
    def brightness(im):
        if r.uniform() < p.brightness_prob:
            delta = r.uniform(-p.brightness_delta, p.brightness_delta)
            return _convert(im, 1, delta) if abs(delta) > 0 else im
        return im

    def contrast(im):
        if r.uniform() < p.contrast_prob:
            factor = r.uniform(p.contrast_lower, p.contrast_upper)
            return _convert(im, factor) if abs(factor - 1) > 1e-3 else im
        return im

    def saturation(im):
        if r.uniform() < p.saturation_prob and im.shape[2] == 3:
            return _hsv_channel(im, 1, r.uniform(p.saturation_lower, p.saturation_upper), 0)
        return im

    def hue(im):
        if r.uniform() < p.hue_prob and im.shape[2] == 3:
            delta = r.uniform(-p.hue_delta, p.hue_delta)
            return _hsv_channel(im, 0, 1, delta) if abs(delta) > 0 else im
        return im

    steps = (brightness, contrast, saturation, hue) if r.uniform() > 0.5 else (brightness, saturation, hue, contrast)
    for step in steps:
        image = step(image)
    if r.uniform() < p.random_order_prob and image.shape[2] == 3:
        image = numpy.ascontiguousarray(image[:, :, r.permutation(3)])
    return image


# each 8-bit value's 64-wide bin's middle (0..63 -> 32, 64..127 -> 96, ...): the fork's colorReduce
POSTERIZE = (numpy.arange(256) // 64 * 64 + 32).astype(numpy.uint8)


def posterize(image):
    """Each value of a uint8 image moved to the middle of its 64-wide bin (:data:`POSTERIZE`)."""
    return POSTERIZE[image]


def _on_luma(image, equalize):
    """``equalize`` (uint8 plane -> plane) applied to a grey image, or to the Y plane of a colour one (YCrCb)."""
    import cv2
    if image.shape[2] == 1:
        return equalize(image[:, :, 0])[:, :, None]
    ycrcb = cv2.cvtColor(image, cv2.COLOR_BGR2YCrCb)
    ycrcb[:, :, 0] = equalize(numpy.ascontiguousarray(ycrcb[:, :, 0]))
    return cv2.cvtColor(ycrcb, cv2.COLOR_YCrCb2BGR)


def salt_pepper(image, fraction, values, r):
    """``floor(fraction x H x W)`` distinct pixels, drawn with ``r``, set to ``values`` (one, or one per channel).
    The fork draws the pixels with replacement (a pixel may be drawn twice, so a few less are set); here they
    are distinct, so the fraction is exact."""
    h, w, c = image.shape
    count = math.floor(numpy.float32(fraction) * w * h)
    if len(values) not in (1, c):
        raise DataError(f"noise_param.saltpepper_param.value has {len(values)} values, the image {c} channels")
    out = image.copy()
    picked = r.choice(h * w, size=count, replace=False)
    out.reshape(h * w, c)[picked] = numpy.array(values, numpy.float32).astype(numpy.uint8)
    return out


def apply_noise(image, p, r):
    """The fork's ApplyNoise on an image (H, W, C uint8, C 1 or 3), in its order: decolorize, Gaussian blur,
    histogram equalization, CLAHE, JPEG round trip, erosion, posterization, inversion, salt and pepper, HSV.
    With ``prob`` given, the whole block applies with that probability (the fork never reads it: always)."""
    import cv2
    if p.prob is not None and not r.uniform() < p.prob:
        return image
    c = image.shape[2]
    if c not in (1, 3):
        raise DataError(f"noise_param works on grey or colour images; this one has {c} channels")

    def keep_channels(im):
        return im.reshape(im.shape[0], im.shape[1], c)

    if p.decolorize and c == 3:  # a grey image is grey already (the fork's cvtColor would refuse it)
        image = cv2.cvtColor(cv2.cvtColor(image, cv2.COLOR_BGR2GRAY), cv2.COLOR_GRAY2BGR)
    if p.gauss_blur:
        image = keep_channels(cv2.GaussianBlur(image, (7, 7), 1.5))
    if p.hist_eq:
        image = _on_luma(image, cv2.equalizeHist)
    if p.clahe:
        image = _on_luma(image, cv2.createCLAHE(clipLimit=4, tileGridSize=(8, 8)).apply)
    if p.jpeg > 0:
        encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, int(p.jpeg)])[1]
        # the fork decodes in colour; a grey image stays grey here so that the channels still match the blob
        image = keep_channels(cv2.imdecode(encoded, cv2.IMREAD_COLOR if c == 3 else cv2.IMREAD_GRAYSCALE))
    if p.erode:
        image = keep_channels(cv2.erode(image, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3), (1, 1))))
    if p.posterize:
        image = posterize(image)
    if p.inverse:
        image = 255 - image
    if p.saltpepper:
        image = salt_pepper(image, p.saltpepper_param.fraction, p.saltpepper_param.value, r)
    if p.convert_to_hsv and c == 3:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2HSV)
    return numpy.ascontiguousarray(image)


def expand(image, boxes, p, fill, emit, r):
    """The fork's ExpandImage: ``(image, boxes)`` placed at a random spot of a canvas ``ratio`` times larger,
    filled with ``fill`` (one value per channel); unchanged with probability 1 - ``prob``."""
    if r.uniform() > p.prob or abs(p.max_expand_ratio - 1) < 1e-2:
        return image, boxes
    ratio = r.uniform(1, p.max_expand_ratio)
    h, w, c = image.shape
    height, width = int(h * ratio), int(w * ratio)
    top, left = math.floor(r.uniform(0, height - h)), math.floor(r.uniform(0, width - w))
    canvas = numpy.empty((height, width, c), numpy.uint8)
    canvas[...] = fill
    canvas[top:top + h, left:left + w] = image
    frame = numpy.array([-left / w, -top / h, (width - left) / w, (height - top) / h], numpy.float32)
    return canvas, transform_boxes(boxes, frame, emit)


def crop_to(image, boxes, box, emit):
    """The fork's CropImage: the pixels under ``box`` (clipped to the image) and the boxes seen through it."""
    h, w = image.shape[:2]
    box = clip_bbox(box)
    scaled = box * numpy.array([w, h, w, h], numpy.float32)
    left, top = int(scaled[0]), int(scaled[1])
    width, height = max(1, int(scaled[2] - scaled[0])), max(1, int(scaled[3] - scaled[1]))
    return image[top:top + height, left:left + width], transform_boxes(boxes, box, emit)


def new_size(p, height, width):
    """(height, width) an image of ``height`` x ``width`` has after ``resize_param`` (the fork's InferNewSize)."""
    if p.resize_mode != "FIT_SMALL_SIZE":
        return p.height, p.width
    aspect = numpy.float32(width) / numpy.float32(height)
    if aspect < numpy.float32(p.width) / numpy.float32(p.height):
        return int(p.width / aspect), p.width
    return p.height, int(aspect * p.height)


def resize(image, p, r):
    """The fork's ApplyResize (pixels only; :func:`resize_boxes` moves the boxes)."""
    import cv2
    interp = {"LINEAR": cv2.INTER_LINEAR, "AREA": cv2.INTER_AREA, "NEAREST": cv2.INTER_NEAREST,
              "CUBIC": cv2.INTER_CUBIC, "LANCZOS4": cv2.INTER_LANCZOS4}
    mode = cv2.INTER_LINEAR
    if p.interp_mode:
        mode = interp[p.interp_mode[int(r.integers(len(p.interp_mode)))].upper()]
    h, w, c = image.shape
    if p.resize_mode == "WARP":
        out = cv2.resize(image, (p.width, p.height), interpolation=mode)
    elif p.resize_mode == "FIT_SMALL_SIZE":
        nh, nw = new_size(p, h, w)
        out = cv2.resize(image, (nw, nh), interpolation=mode)
    else:
        aspect = numpy.float32(w) / numpy.float32(h)
        pad = {"CONSTANT": cv2.BORDER_CONSTANT, "MIRRORED": cv2.BORDER_REFLECT_101,
               "REPEAT_NEAREST": cv2.BORDER_REPLICATE}[p.pad_mode]
        values = list(p.pad_value) * (c if len(p.pad_value) == 1 else 1) or [0.0] * c
        if aspect > numpy.float32(p.width) / numpy.float32(p.height):
            height = math.floor(numpy.float32(p.width) / aspect)
            out = cv2.resize(image, (p.width, height), interpolation=mode)
            top = math.floor((p.height - height) / 2.0)
            out = cv2.copyMakeBorder(out, top, p.height - height - top, 0, 0, pad, value=values)
        else:
            width = math.floor(aspect * numpy.float32(p.height))
            out = cv2.resize(image, (width, p.height), interpolation=mode)
            left = math.floor((p.width - width) / 2.0)
            out = cv2.copyMakeBorder(out, 0, 0, left, p.width - width - left, pad, value=values)
    return out.reshape(out.shape[0], out.shape[1], c)


def resize_boxes(boxes, p, height, width):
    """Boxes of an image of ``height`` x ``width`` as they lie after ``resize_param``: the fork's
    UpdateBBoxByResizePolicy (clipped to the picture; the padding of FIT_LARGE_SIZE_AND_PAD added)."""
    out = boxes.copy()
    new_h, new_w = numpy.float32(p.height), numpy.float32(p.width)
    aspect = numpy.float32(width) / numpy.float32(height)
    x = boxes[:, [2, 4]] * width
    y = boxes[:, [3, 5]] * height

    def fit(v, old, new):
        return numpy.maximum(0, v[:, 0] * new / old), numpy.minimum(new, v[:, 1] * new / old)

    if p.resize_mode == "FIT_LARGE_SIZE_AND_PAD":
        if aspect > new_w / new_h:
            padding = (new_h - new_w / aspect) / 2
            (x0, x1) = fit(x, width, new_w)
            y0 = padding + numpy.maximum(0, y[:, 0] * (new_h - 2 * padding) / height)
            y1 = padding + numpy.minimum(new_h, y[:, 1] * (new_h - 2 * padding) / height)
        else:
            padding = (new_w - aspect * new_h) / 2
            x0 = padding + numpy.maximum(0, x[:, 0] * (new_w - 2 * padding) / width)
            x1 = padding + numpy.minimum(new_w, x[:, 1] * (new_w - 2 * padding) / width)
            (y0, y1) = fit(y, height, new_h)
    else:
        if p.resize_mode == "FIT_SMALL_SIZE":
            if aspect < new_w / new_h:
                new_h = new_w / aspect
            else:
                new_w = aspect * new_h
        (x0, x1), (y0, y1) = fit(x, width, new_w), fit(y, height, new_h)
    out[:, 2], out[:, 3], out[:, 4], out[:, 5] = x0 / new_w, y0 / new_h, x1 / new_w, y1 / new_h
    return out


def extrapolate_boxes(boxes, p, height, width, crop):
    """The fork's ExtrapolateBBox: with FIT_SMALL_SIZE and height_scale / width_scale set, boxes are scaled
    from the cropped picture to those sizes."""
    if not (p.height_scale > 0 and p.width_scale > 0 and p.resize_mode == "FIT_SMALL_SIZE"):
        return boxes
    aspect = numpy.float32(width) / numpy.float32(height)
    rh, rw = numpy.float32(p.height), numpy.float32(p.width)
    if aspect < rw / rh:
        rh = rw / aspect
    else:
        rw = rh * aspect
    crop_h, crop_w = rh * (crop[3] - crop[1]), rw * (crop[2] - crop[0])
    out = boxes.copy()
    out[:, [2, 4]] *= crop_w / p.width_scale
    out[:, [3, 5]] *= crop_h / p.height_scale
    return out


class AnnotatedBatches(BatchStream):
    """Batches of the AnnotatedData layer: which records, planned from (seed, position) as BatchStream does, and
    how a decode worker makes one image and its boxes (see the module docstring for the steps).

    Args (beyond BatchStream's, whose ``transform`` is the layer's DataTransformer for the mean and scale):
        t: the validated ``transform`` block (ANNOTATED_TRANSFORM).
        samplers: the ``batch_sampler`` blocks.
        phase: "TRAIN" or "TEST".
        typed: the records carry boxes (else the label of each Datum is the label).
        anno_type_given: ``anno_type`` of the layer replaces the records' own.
        output: (C, h, w) of every image of a batch, or None when it varies (no resize_param and no crop, or
            FIT_SMALL_SIZE): such an image comes back through the worker's pipe.
    """

    returns = True

    def __init__(self, read, size, batch_size, transform, shuffle, seed, rank, world_size, name_of, t, samplers,
                 phase, typed, anno_type_given, output):
        super().__init__(read, size, batch_size, transform, shuffle, seed, rank, world_size, name_of=name_of)
        self.t, self.samplers, self.train, self.typed = t, samplers, phase == "TRAIN", typed
        self.anno_type_given, self.output = anno_type_given, output
        self.emit = t.emit_constraint if t.given("emit_constraint") else None
        crop = (t.crop_size, t.crop_size) if t.crop_size else (t.crop_h, t.crop_w)
        self.crop = crop if crop[0] > 0 and crop[1] > 0 else None

    def layout(self):
        """The batch's uint8 images (N, C, h, w) when their shape is fixed, else nothing (they come back whole)."""
        return [((self.batch_size,) + tuple(self.output), numpy.uint8)] if self.output else []

    def plan(self, position):
        """``(items, None)``: per image i, ``(i, record index, seed of its randomness)``."""
        seeds = numpy.random.default_rng([self.seed, 1, position]).integers(2 ** 63, size=self.batch_size)
        return list(zip(range(self.batch_size), self.indices(position, self.batch_size), seeds.tolist())), None

    def fill(self, arrays, item):
        """Make image ``item`` of a batch; returns ``(boxes (k, 7), label, (h0, w0), image or None)``: its boxes
        in the output's coordinates (or its label), the crop offset in the resized picture (for a mean_file), and
        the image (C, h, w) when it does not go into ``arrays``."""
        i, index, seed = item
        r = numpy.random.default_rng(seed)
        image, boxes, label, typed = self.read(index)
        if self.typed and not typed and not self.anno_type_given:
            raise DataError(f"{self.name_of(index)}: the record misses an AnnotationType, the first record has one "
                            "(set annotated_data.anno_type to give every record one)")
        hwc = image.transpose(1, 2, 0)
        if self.t.given("distort_param"):
            hwc = distort(numpy.ascontiguousarray(hwc), self.t.distort_param, r)
        if self.t.given("expand_param"):
            fill = numpy.zeros(hwc.shape[2])
            if self.t.mean_value:
                fill[...] = numpy.rint(self.t.mean_value).clip(0, 255)
            hwc, boxes = expand(hwc, boxes, self.t.expand_param, fill, self.emit, r)
        if self.samplers:
            samples = batch_samples(boxes[:, 2:6], self.samplers, r)
            if samples:
                hwc, boxes = crop_to(hwc, boxes, samples[int(r.integers(len(samples)))], self.emit)
        out, boxes, offset = self.transform_image(hwc, boxes, r, index)
        if self.output:
            if out.shape != arrays[0].shape[1:]:
                raise DataError(f"{self.name_of(index)}: the image is {out.shape[1]}x{out.shape[2]} after the "
                                f"transform, the batch's are {arrays[0].shape[2]}x{arrays[0].shape[3]}")
            arrays[0][i] = out
            out = None
        return boxes, label, offset, out

    def transform_image(self, hwc, boxes, r, index):
        """The fork's Transform of one picture: resize, crop, mirror; ``(image (C, h, w) uint8, boxes, (h0, w0))``."""
        t, (h, w) = self.t, hwc.shape[:2]
        resized = resize(hwc, t.resize_param, r) if t.given("resize_param") else hwc
        if t.given("noise_param"):
            try:
                resized = apply_noise(numpy.ascontiguousarray(resized), t.noise_param, r)
            except DataError as e:
                raise DataError(f"{self.name_of(index)}: {e}") from None
        height, width = resized.shape[:2]
        out_h, out_w = self.crop or (height, width)
        if out_h > height or out_w > width:
            raise DataError(f"{self.name_of(index)}: the crop {out_h}x{out_w} is larger than the image "
                            f"({height}x{width} after resizing)")
        if self.crop and self.train:
            h0, w0 = int(r.integers(height - out_h + 1)), int(r.integers(width - out_w + 1))
        else:
            h0, w0 = (height - out_h) // 2, (width - out_w) // 2
        mirror = bool(t.mirror and self.train and r.integers(2))
        picture = resized[h0:h0 + out_h, w0:w0 + out_w]
        if mirror:
            picture = picture[:, ::-1]
        crop = numpy.array([w0 / width, h0 / height, (w0 + out_w) / width, (h0 + out_h) / height], numpy.float32)
        if len(boxes):
            if t.given("resize_param"):
                boxes = resize_boxes(boxes, t.resize_param, h, w)
            boxes = transform_boxes(boxes, crop, self.emit, mirror)
            if t.given("resize_param"):
                boxes = extrapolate_boxes(boxes, t.resize_param, h, w, crop)
        image = numpy.ascontiguousarray(picture.reshape(out_h, out_w, -1).transpose(2, 0, 1))
        return image, boxes, (h0, w0)

    def finish(self, xp, arrays, extra, top):
        """Reshape and fill the tops (Blobs): the images, mean-subtracted and scaled on ``xp``, and the labels:
        the (1, 1, K, 8) box list ``image, label, instance, xmin, ymin, xmax, ymax, difficult`` (one row of -1 for
        a batch without boxes), or the (N,) labels of untyped records."""
        _, values = extra
        n = self.batch_size
        h0 = numpy.array([v[2][0] for v in values])
        w0 = numpy.array([v[2][1] for v in values])
        plan = (h0, w0, numpy.zeros(n, bool))  # the fork subtracts the mean where the pixel lands: never mirrored
        if self.output:
            top[0].reshape((n,) + tuple(self.output))
            self.transform.finish(xp, arrays[0], plan, top[0].data)
        else:
            shapes = {v[3].shape for v in values}
            if len(shapes) > 1:
                raise DataError(f"the images of a batch differ in shape after the transform ({sorted(shapes)}); "
                                "give transform.resize_param or a crop, or batch_size 1")
            images = numpy.stack([v[3] for v in values])
            top[0].reshape(images.shape)
            self.transform.finish(xp, xp.asarray(images), plan, top[0].data)
        if len(top) < 2:
            return
        if not self.typed:
            top[1].reshape((n,))
            top[1].data[...] = xp.asarray(numpy.array([v[1] for v in values], numpy.float64))
            return
        rows = [numpy.concatenate([numpy.full((len(v[0]), 1), i, numpy.float32), v[0]], axis=1)
                for i, v in enumerate(values)]
        rows = numpy.concatenate(rows) if rows else numpy.zeros((0, 8), numpy.float32)
        if not len(rows):
            rows = numpy.full((1, 8), -1, numpy.float32)
        top[1].reshape((1, 1, len(rows), 8))
        top[1].data[...] = xp.asarray(rows)
