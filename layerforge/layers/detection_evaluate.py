"""DetectionEvaluate: true and false positives of detections (the SSD fork's layer)."""
import numpy

from ..backend import to_numpy
from ..data.detection_results import output_boxes, read_names_and_sizes
from ..data.detection_transform import RESIZE
from ..errors import DataError, ShapeError
from ..kernels.bbox import bbox_size, intersect_bbox, jaccard_overlap
from .base import Field, Layer, register_layer


def pixel_overlap(a, b):
    """Jaccard overlap of pixel boxes (broadcast) as the fork's DetectionEvaluate takes it after OutputBBox: the
    intersection and both areas count end pixels (+1 on each extent; two disjoint boxes still share the 1 x 1
    corner box (0, 0), as in the fork)."""
    inter = intersect_bbox(a, b)
    w, h = inter[..., 2] - inter[..., 0] + 1, inter[..., 3] - inter[..., 1] + 1
    size = w * h
    return numpy.where((w > 0) & (h > 0), size / (bbox_size(a, False) + bbox_size(b, False) - size), 0)


@register_layer("DetectionEvaluate")
class DetectionEvaluate(Layer):
    """True and false positives of detections against the ground truth, for the mAP (the SSD fork's layer).

    Bottoms: DetectionOutput's detections (1, 1, D, 7) ``image, label, score, xmin, ymin, xmax, ymax`` and
    AnnotatedData's ground truth (1, 1, K, 8). Top (1, 1, C' + D', 5) rows ``image, label, score, tp, fp``: first,
    for each class but the background, ``-1, class, number of ground-truth boxes, -1, -1`` (not counting difficult
    boxes unless ``evaluate_difficult_gt``); then one row per detection, by image, by label, by descending score.
    A detection is a true positive when its best Jaccard overlap with a box of its class and image reaches
    ``overlap_threshold`` and that box was not taken by a higher-scoring detection; a detection whose best box is
    difficult (and not evaluated) gets tp = fp = 0 and counts for nothing. The solver's and ``layerforge test``'s
    mAP is computed from these rows (layerforge/kernels/average_precision.py).

    With ``name_size_file`` (``name height width`` lines in the order of the test database), boxes are compared in
    pixels of each original image, as the fork does (``resize_param`` undoes its resizing first).
    """

    param_blocks = {"detection_evaluate": {
        "num_classes": Field("int", None, min=1, doc="classes predicted, background included (required)"),
        "background_label_id": Field("int", 0, doc="the background class (-1: none)"),
        "overlap_threshold": Field("float", 0.5, doc="Jaccard overlap from which a detection is a true positive"),
        "evaluate_difficult_gt": Field("bool", True, doc="count difficult boxes too"),
        "name_size_file": Field("str", None, doc="'name height width' of each test image: compare in pixels"),
        "resize_param": Field(RESIZE, None, doc="the test data's resize_param, undone for name_size_file"),
    }}
    num_bottom = (2, 2)
    has_backward = False
    backward_reads = ()
    capturable = False

    @classmethod
    def validate_params(cls, lp):
        p = lp.detection_evaluate
        if p.num_classes is None:
            raise lp.error("needs num_classes (the classes predicted, background included)",
                           "detection_evaluate.num_classes")
        if p.overlap_threshold <= 0:
            raise lp.error("overlap_threshold must be above 0", "detection_evaluate.overlap_threshold")

    def layer_setup(self, bottom, top):
        self.p = self.layer_param.detection_evaluate
        self.sizes = read_names_and_sizes(self.p.name_size_file)[1] if self.p.name_size_file else []
        self.count = 0
        self.resize = self.p.resize_param if self.p.given("resize_param") else None

    def reshape(self, bottom, top):
        for b, width, what in ((0, 7, "detections"), (1, 8, "ground truth")):
            if bottom[b].count % width:
                raise ShapeError(f"the {what} (shape {bottom[b].shape}) must be rows of {width} values", key="bottom")
        classes = self.p.num_classes - (self.p.background_label_id != -1)
        valid = int((to_numpy(bottom[0].data).reshape(-1, 7)[:, 1] != -1).sum())
        top[0].reshape((1, 1, classes + valid, 5))

    def forward(self, bottom, top):
        p, where = self.p, f"layer '{self.name}' (DetectionEvaluate)"
        det = to_numpy(bottom[0].data).reshape(-1, 7).astype(numpy.float32)
        gt = to_numpy(bottom[1].data).reshape(-1, 8).astype(numpy.float32)
        det = det[det[:, 0] != -1]
        first_empty = numpy.flatnonzero(gt[:, 0] == -1)
        gt = gt[:first_empty[0]] if len(first_empty) else gt  # the fork reads the ground truth up to the first -1
        for rows, what in ((det, "detection results"), (gt, "dataset")):
            if (rows[:, 1] == p.background_label_id).any():
                raise DataError(f"{where}: found the background label {p.background_label_id} in the {what}")
        out = []
        counted = gt if p.evaluate_difficult_gt else gt[gt[:, 7] == 0]
        for c in range(p.num_classes):
            if c != p.background_label_id:
                out.append((-1, c, float((counted[:, 1] == c).sum()), -1, -1))
        for image in sorted(set(det[:, 0].astype(int).tolist())):
            mine, boxes = det[det[:, 0] == image], gt[gt[:, 0] == image]
            size = self.sizes[self.count] if self.sizes else None
            for label in sorted(set(mine[:, 1].astype(int).tolist())):
                found = mine[mine[:, 1] == label]
                truth = boxes[boxes[:, 1] == label]
                if not len(truth):
                    out += [(image, label, float(s), 0, 1) for s in found[:, 2]]
                    continue
                found = found[numpy.argsort(-found[:, 2], kind="stable")]
                out += self.judge(image, label, found, truth, size)
            if self.sizes:
                self.count = (self.count + 1) % len(self.sizes)
        rows = numpy.zeros(top[0].shape, numpy.float64).reshape(-1, 5)
        rows[:len(out)] = numpy.array(out, numpy.float64).reshape(-1, 5)
        top[0].data[...] = self.xp.asarray(rows.reshape(top[0].shape))

    def judge(self, image, label, found, truth, size):
        """Rows ``image, label, score, tp, fp`` of one image's detections of one class (best score first)."""
        det_boxes, gt_boxes = found[:, 3:7], truth[:, 3:7]
        if size is not None:
            det_boxes = output_boxes(det_boxes, size, self.resize)
            gt_boxes = output_boxes(gt_boxes, size, self.resize)
        overlap = jaccard_overlap if size is None else pixel_overlap
        overlaps = overlap(det_boxes[:, None], gt_boxes[None])
        taken = numpy.zeros(len(truth), bool)
        rows = []
        for k, score in enumerate(found[:, 2]):
            j = int(overlaps[k].argmax())
            if overlaps[k, j] < self.p.overlap_threshold:
                rows.append((image, label, float(score), 0, 1))
            elif not self.p.evaluate_difficult_gt and truth[j, 7]:
                rows.append((image, label, float(score), 0, 0))  # a difficult box: neither
            else:
                rows.append((image, label, float(score), 0 if taken[j] else 1, 1 if taken[j] else 0))
                taken[j] = True
        return rows
