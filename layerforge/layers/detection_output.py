"""DetectionOutput: SSD's decoding and per-class NMS into a detection list (weiliu89/caffe branch ssd)."""
import logging
import weakref

import numpy

from ..data.annotations import label_to_name, read_label_map
from ..data.detection_results import FORMATS, DetectionVideo, ResultFiles
from ..data.detection_transform import resize
from ..data.transform import DataTransformer
from ..backend import to_numpy
from ..errors import DataError, ShapeError
from ..kernels import bbox
from .base import Field, Layer, register_layer
from .data import FORK_TRANSFORM

log = logging.getLogger("layerforge")

NMS = {
    "nms_threshold": Field("float", 0.3, min=0.0, doc="suppress a box overlapping a kept one by more than this"),
    "top_k": Field("int", None, doc="candidates per class, highest scores first (default: all)"),
    "eta": Field("float", 1.0, doc="adaptive NMS: the threshold is multiplied by eta after each kept box (0 < eta <= 1)"),
}

RESIZE = {
    "prob": Field("float", 1.0), "resize_mode": Field("enum", "WARP", choices=("WARP", "FIT_SMALL_SIZE",
                                                                               "FIT_LARGE_SIZE_AND_PAD")),
    "height": Field("int", 0, min=0), "width": Field("int", 0, min=0),
    "height_scale": Field("int", 0, min=0), "width_scale": Field("int", 0, min=0),
    "pad_mode": Field("enum", "CONSTANT", choices=("CONSTANT", "MIRRORED", "REPEAT_NEAREST")),
    "pad_value": Field("floats", []),
    "interp_mode": Field("strs", []),
}

SAVE_OUTPUT = {
    "output_directory": Field("str", "", doc="write result files here (none when empty)"),
    "output_name_prefix": Field("str", "", doc="the start of each result file's name"),
    "output_format": Field("str", "", doc=f"{' / '.join(FORMATS)} (layerforge/data/detection_results.py)"),
    "label_map_file": Field("str", "", doc="the label map: each class's name"),
    "name_size_file": Field("str", "", doc="'name height width' of the test images, in the database's order"),
    "num_test_image": Field("int", None, min=0, doc="images per round of files (default: the name size file's)"),
    "resize_param": Field(RESIZE, doc="the test data's resize_param, undone for the pixel boxes"),
}


@register_layer("DetectionOutput")
class DetectionOutput(Layer):
    """Detections of each image: location predictions decoded against the priors, per-class NMS, the best kept.

    Bottoms: loc (N, P L 4) offsets of the P priors (L = 1 with ``share_location``, else ``num_classes``), conf
    (N, P C) class confidences (after a softmax), priors (1, 2, P 4) from PriorBox (boxes, then variances); an
    optional fourth bottom, the image, serves the fork's ``visualize`` only.
    Each class other than ``background_label_id`` keeps the boxes :func:`layerforge.kernels.bbox.detections`
    keeps (scores above ``confidence_threshold``, NMS with ``nms_param``), then the image keeps its best
    ``keep_top_k``. Decoding follows ``code_type`` and ``variance_encoded_in_target``; ``clip`` (OpenCV's field)
    clamps the decoded boxes to [0, 1] before NMS.

    Top: (1, 1, D, 7), one row ``[image, label, score, xmin, ymin, xmax, ymax]`` per detection, by image, then
    label, then score; with no detection at all, one row ``[i, -1, -1, -1, -1, -1, -1]`` per image i (the fork's).
    Its size follows the data. No gradient. With ``save_output_param.output_directory`` the detections also go
    to the fork's result files (VOC, COCO or ILSVRC, in pixels of the original images; a round of files every
    ``num_test_image`` images: layerforge/data/detection_results.py). ``visualize`` with ``save_file`` and a
    fourth bottom (the transformed images) draws the detections above ``visualize_threshold`` (default 0.6) on
    the images, restored by the layer's ``transform`` block (its mean and scale, then its ``resize_param``: the
    fork's TransformInv), and appends them to the video ``save_file``, as the fork's ssd_pascal_video.py asks;
    the fork's window is not opened (a warning says so when there is no save_file).
    """

    param_blocks = {"detection_output": {
        "num_classes": Field("int", None, min=1, doc="number of classes, background included; required"),
        "share_location": Field("bool", True, doc="one box per prior for all classes; false: one per class"),
        "background_label_id": Field("int", 0, doc="the class that yields no detections (-1: none)"),
        "nms_param": Field(NMS, doc="per class: nms_threshold (0.3), top_k (all), eta (1: fixed threshold)"),
        "save_output_param": Field(SAVE_OUTPUT, doc="the fork's result files for the VOC / COCO / ILSVRC evaluations"),
        "code_type": Field("enum", "CORNER", choices=bbox.CODE_TYPES, doc="how the offsets encode boxes"),
        "variance_encoded_in_target": Field("bool", False, doc="the offsets already include the variances"),
        "keep_top_k": Field("int", -1, doc="detections kept per image after NMS (-1: all)"),
        "confidence_threshold": Field("float", None, doc="only scores above this count (default: all)"),
        "visualize": Field("bool", False, doc="draw the detections on the fourth bottom's images (into save_file)"),
        "visualize_threshold": Field("float", None, doc="draw the detections scoring this much (default 0.6)"),
        "save_file": Field("str", "", doc="the video (DIVX .avi) the drawn images are appended to"),
        "clip": Field("bool", False, doc="OpenCV's field: clamp the decoded boxes to [0, 1]"),
    }, "transform": {key: FORK_TRANSFORM[key] for key in ("scale", "mean_file", "mean_value", "resize_param")}}
    num_bottom = (3, 4)  # a fourth, the image, is for the fork's visualize
    has_backward = False
    backward_reads = ()
    capturable = False  # the top's size follows the data

    @classmethod
    def validate_params(cls, lp):
        p = lp.detection_output
        if p.num_classes is None:
            raise lp.error("required: num_classes", "detection_output.num_classes")
        if not 0 < p.nms_param.eta <= 1:
            raise lp.error(f"eta must be in (0, 1], got {p.nms_param.eta}", "detection_output.nms_param.eta")

    def allow_force_backward(self, bottom_index):
        return False

    def layer_setup(self, bottom, top):
        p = self.layer_param.detection_output
        self.video = None
        if p.visualize and not p.save_file:
            log.warning("layer '%s' (DetectionOutput): visualize opens no window here; give save_file to write the "
                        "drawn images to a video (the top holds the detections)", self.name)
        elif p.visualize:
            if len(bottom) < 4:
                raise self.layer_param.error("visualize draws on the images: give them as a fourth bottom",
                                             "bottom")
            label_map = p.save_output_param.label_map_file
            names = label_to_name(read_label_map(label_map)) if label_map else {}
            threshold = 0.6 if p.visualize_threshold is None else p.visualize_threshold
            self.video = DetectionVideo(p.save_file, threshold, names, p.num_classes)
            self.restorer = DataTransformer(self.layer_param.transform, "TEST", source=f"layer '{self.name}'")
            weakref.finalize(self, self.video.close)
        self.results = None
        if p.save_output_param.output_directory:
            try:
                self.results = ResultFiles(p.save_output_param, p.num_classes, p.background_label_id,
                                           f"layer '{self.name}' (DetectionOutput)")
            except DataError as e:  # a deploy file keeps its test net's paths: detect, and say what is not written
                log.warning("layer '%s' (DetectionOutput): no result files will be written to %s: %s", self.name,
                            p.save_output_param.output_directory, e)

    def reshape(self, bottom, top):
        p = self.layer_param.detection_output
        loc_classes = 1 if p.share_location else p.num_classes
        self.num_priors = bottom[2].shape[2] // 4 if len(bottom[2].shape) > 2 else 0
        n = bottom[0].shape[0]
        for i, per_prior, what in ((0, loc_classes * 4, "location"), (1, p.num_classes, "confidence")):
            if bottom[i].shape[0] != n or bottom[i].count != n * self.num_priors * per_prior:
                hint = ("; twice the priors' count: TextBoxes' fork repeats every prior half a cell lower (convert "
                        "its file with `layerforge convert --fork textboxes`, or give its PriorBox layers OpenCV's "
                        "offset_w: [0.5, 0.5] and offset_h: [0.5, 1.0])"
                        if bottom[i].count == 2 * n * self.num_priors * per_prior else "")
                raise ShapeError(f"{what} predictions of shape {bottom[i].shape} do not fit {self.num_priors} priors "
                                 f"x {per_prior} per image{hint}", key=f"bottom[{i}]")
        top[0].reshape(1, 1, 1, 7)

    def forward(self, bottom, top):
        p, xp = self.layer_param.detection_output, self.xp
        n, priors = bottom[0].shape[0], bottom[2].data[0].reshape(2, self.num_priors, 4)
        offsets = bottom[0].data.reshape(n, self.num_priors, -1, 4).transpose(0, 2, 1, 3)  # (N, L, P, 4)
        boxes = bbox.decode_bbox(priors[0], priors[1], p.code_type, p.variance_encoded_in_target, offsets, p.clip)
        scores = bottom[1].data.reshape(n, self.num_priors, p.num_classes).transpose(0, 2, 1)  # (N, C, P)
        threshold = -numpy.inf if p.confidence_threshold is None else p.confidence_threshold
        top_k = -1 if p.nms_param.top_k is None else p.nms_param.top_k
        rows = []
        for i in range(n):
            found = bbox.detections(boxes[i], scores[i], p.background_label_id, p.nms_param.nms_threshold, threshold,
                                    p.nms_param.eta, top_k, p.keep_top_k)
            rows.append(numpy.concatenate([numpy.full((len(found), 1), i, found.dtype), found], axis=1))
            if self.results is not None:
                self.results.add_image(found)
        if self.video is not None:
            self.draw(bottom[3], rows)
        found = numpy.concatenate(rows)
        if not len(found):
            found = numpy.full((n, 7), -1, found.dtype)
            found[:, 0] = numpy.arange(n)
        top[0].reshape(1, 1, len(found), 7)
        top[0].data[...] = xp.asarray(found.reshape(top[0].shape), dtype=top[0].dtype)

    def draw(self, images, rows):
        """The images of the fourth bottom restored (the layer's mean, scale and resize_param) with ``rows``
        drawn, into the video."""
        t = self.layer_param.transform
        pictures = self.restorer.restore(to_numpy(images.data))
        if t.given("resize_param"):
            r = numpy.random.default_rng(0)  # an interpolation mode drawn from a list
            pictures = [resize(picture, t.resize_param, r) for picture in pictures]
            pictures = [picture.reshape(picture.shape[0], picture.shape[1], -1) for picture in pictures]
        self.video.add([numpy.ascontiguousarray(picture) for picture in pictures], numpy.concatenate(rows))

    def backward(self, top, propagate_down, bottom):
        if any(propagate_down):
            raise NotImplementedError("DetectionOutput has no backward")
