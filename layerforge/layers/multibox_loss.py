"""MultiBoxLoss: SSD's training loss (the SSD fork's MultiBoxLossLayer)."""
import numpy

from ..backend import to_numpy
from ..errors import DataError, ShapeError
from ..kernels import multibox
from ..schema import LOSS
from .base import Field, register_layer
from .loss import LossLayer, _LossNormalization

CODE_TYPES = ("CORNER", "CENTER_SIZE", "CORNER_SIZE")
NMS = {
    "nms_threshold": Field("float", 0.3, doc="overlap above which a lower-loss box is suppressed"),
    "top_k": Field("int", None, doc="keep at most this many boxes"),
    "eta": Field("float", 1.0, doc="adaptive NMS factor (unused by mining)"),
}
MULTIBOX_LOSS = {
    "loc_loss_type": Field("enum", "SMOOTH_L1", choices=("L2", "SMOOTH_L1"), doc="location loss"),
    "conf_loss_type": Field("enum", "SOFTMAX", choices=("SOFTMAX", "LOGISTIC"), doc="confidence loss"),
    "loc_weight": Field("float", 1.0, doc="weight of the location loss"),
    "num_classes": Field("int", None, min=1, doc="classes predicted, background included (required)"),
    "share_location": Field("bool", True, doc="one box per prior for all classes"),
    "match_type": Field("enum", "PER_PREDICTION", choices=("BIPARTITE", "PER_PREDICTION"),
                        doc="bipartite matching only, or then every prior above overlap_threshold"),
    "overlap_threshold": Field("float", 0.5, doc="PER_PREDICTION: Jaccard overlap from which a prior matches"),
    "use_prior_for_matching": Field("bool", True, doc="match the priors (false: the decoded predictions)"),
    "background_label_id": Field("int", 0, doc="the background class"),
    "use_difficult_gt": Field("bool", True, doc="match difficult boxes too"),
    "do_neg_mining": Field("bool", None, doc="deprecated: must agree with mining_type"),
    "neg_pos_ratio": Field("float", 3.0, doc="MAX_NEGATIVE: negatives per positive"),
    "neg_overlap": Field("float", 0.5, doc="MAX_NEGATIVE: a negative overlaps every box less than this"),
    "code_type": Field("enum", "CORNER", choices=CODE_TYPES, doc="how a box is coded against its prior"),
    "encode_variance_in_target": Field("bool", False, doc="the variances scale the loss, not the coding"),
    "map_object_to_agnostic": Field("bool", False, doc="every object class becomes class background + 1"),
    "ignore_cross_boundary_bbox": Field("bool", False, doc="priors crossing the image border never match"),
    "bp_inside": Field("bool", False, doc="only coordinates inside the image learn (CORNER, CORNER_SIZE)"),
    "mining_type": Field("enum", "MAX_NEGATIVE", choices=("NONE", "MAX_NEGATIVE", "HARD_EXAMPLE"),
                         doc="which unmatched priors score as background"),
    "nms_param": Field(NMS, None, doc="NMS over the mining candidates before picking"),
    "sample_size": Field("int", 64, doc="HARD_EXAMPLE: examples per image"),
    "use_prior_for_nms": Field("bool", False, doc="NMS over the priors (false: the decoded predictions)"),
    "exact_gradient": Field("bool", False, doc="layerforge: the true location gradient with "
                                               "encode_variance_in_target (default: the fork's, 1 / variance left out)"),
}


@register_layer("MultiBoxLoss")
class MultiBoxLoss(_LossNormalization, LossLayer):
    """SSD's training loss, location regression plus confidence (the SSD fork's MultiBoxLossLayer).

    Bottoms: location predictions (N, P L 4) (L = 1 with ``share_location``, else ``num_classes``), confidence
    scores (N, P C), the priors (1, 2, 4 P) (PriorBox's boxes then variances) and the ground truth (1, 1, K, 8)
    (AnnotatedData's list). The bookkeeping (matching, mining) runs on the host, as the fork does it even on a GPU
    (layerforge/kernels/multibox.py); the losses and gradients run on the predictions' device.

        loss = (loc_weight * sum_matched loc_loss(loc / v - target) + sum_scored conf_loss) / normalizer

    over the matched (prior, class) pairs and, for the confidences, the matched priors and the mined negatives
    (every prior without mining). ``loss.normalization``: VALID divides by the matched pairs, FULL by N P,
    BATCH_SIZE by N, NONE by 1 (at least 1 in every case). As in the fork, the location term counts only when
    ``propagate_down`` (default true, true, false, false) lets bottom 0 learn, the confidence term when bottom 1.
    Replicas that share a batch (``batch_group``: the CPU replicas, MPI ranks) count VALID's matches over all of
    them, so that the mean of their gradients is the whole batch's.

    v is the prior's variance with ``encode_variance_in_target`` (the target then divided by it too, as the fork's
    EncodeLocPrediction divides both), else 1. The location gradient is the fork's, which copies d's gradient back
    unscaled (multibox_loss_layer.cpp's Backward_cpu): for each matched coordinate, with d = loc / v - target
    (0 where ``bp_inside`` leaves the coordinate out),

        gloc = loc_weight * loc_loss'(d) * top_diff / normalizer

    With v != 1 that is v times the true gradient (a tenth of it with a variance of 0.1).
    ``exact_gradient: true`` (a layerforge key) gives the true one, gloc = loc_weight * loc_loss'(d) / v *
    top_diff / normalizer. Without encode_variance_in_target the two agree.

    Deliberate differences from the fork's C++: with LOGISTIC confidences and no mining, the fork offsets image
    i's targets by i P values instead of i P C (so they land in the first images' rows); here each image's rows
    get its own. ``map_object_to_agnostic`` maps the labels before mining too (the fork's
    mining fails its label check there). Mining orders equal losses by prior (the fork's std::sort does not say).
    """

    param_blocks = {"multibox_loss": MULTIBOX_LOSS, "loss": LOSS}
    num_bottom = (4, 4)
    label_bottom = 2
    backward_reads = ()  # forward keeps the gradients of the rows it scored
    capturable = False  # matching and mining decide on the host
    # replicas of one batch (CPU replicas, MPI ranks): ``sum(values)`` over them and ``count``; an ``armed`` False
    # group (MPI, outside the training passes the ranks make in step) is not asked
    batch_group = None

    @classmethod
    def validate_params(cls, lp):
        p = lp.multibox_loss
        if p.num_classes is None:
            raise lp.error("needs num_classes (the classes predicted, background included)",
                           "multibox_loss.num_classes")
        if p.do_neg_mining is not None and p.do_neg_mining != (p.mining_type != "NONE"):
            raise lp.error(f"do_neg_mining {str(p.do_neg_mining).lower()} contradicts mining_type {p.mining_type}",
                           "multibox_loss.do_neg_mining")
        if p.mining_type != "NONE" and not p.share_location:
            raise lp.error("mining needs share_location (the fork mines only shared locations)",
                           "multibox_loss.mining_type")
        if p.conf_loss_type == "SOFTMAX" and not 0 <= p.background_label_id < p.num_classes:
            raise lp.error(f"background_label_id {p.background_label_id} must lie in [0, {p.num_classes}) for "
                           "SOFTMAX", "multibox_loss.background_label_id")
        if p.map_object_to_agnostic and p.num_classes != (2 if p.background_label_id >= 0 else 1):
            raise lp.error("map_object_to_agnostic needs num_classes 2 (1 without a background)",
                           "multibox_loss.num_classes")
        if not lp.propagate_down:  # the fork's default: the predictions learn, the priors and labels do not
            lp.propagate_down = [True, True, False, False]

    def allow_force_backward(self, bottom_index):
        return bottom_index < 2

    def layer_setup(self, bottom, top):
        self.p = self.layer_param.multibox_loss
        self.read_normalization()
        given = self.layer_param.propagate_down
        self.learns = (given[0], given[1]) if given else (True, True)
        self.loc_classes = 1 if self.p.share_location else self.p.num_classes

    def reshape(self, bottom, top):
        n, c = bottom[0].shape[0], self.p.num_classes
        self.num_priors = bottom[2].count // 8 if bottom[2].shape else 0
        if bottom[2].count != 8 * self.num_priors or bottom[2].count == 0:
            raise ShapeError(f"the priors (shape {bottom[2].shape}) must be PriorBox's (1, 2, 4 P)", key="bottom")
        for b, per_prior, what in ((0, 4 * self.loc_classes, "location"), (1, c, "confidence")):
            if bottom[b].shape[0] != n or bottom[b].count != n * self.num_priors * per_prior:
                raise ShapeError(f"the {what} predictions (shape {bottom[b].shape}) must hold {per_prior} values for "
                                 f"each of the {self.num_priors} priors of each of the {n} images", key="bottom")
        if bottom[3].count % 8:
            raise ShapeError(f"the ground truth (shape {bottom[3].shape}) must be rows of 8 values", key="bottom")
        top[0].reshape(())

    def forward(self, bottom, top):
        xp, p, n, num_priors = self.xp, self.p, bottom[0].shape[0], self.num_priors
        priors = to_numpy(bottom[2].data).reshape(2, num_priors, 4).astype(numpy.float32)
        gt = self.ground_truth(bottom[3], n)
        loc = bottom[0].data.reshape(n, num_priors, self.loc_classes, 4)
        conf = bottom[1].data.reshape(n * num_priors, p.num_classes)
        on_host = (not p.use_prior_for_matching or p.mining_type == "HARD_EXAMPLE" or
                   (p.given("nms_param") and not p.use_prior_for_nms))
        loc_host = to_numpy(loc).astype(numpy.float32) if on_host else None
        matches, overlaps = multibox.find_matches(gt, priors[0], priors[1], loc_host, p, n)
        negatives = [numpy.zeros(0, numpy.int64)] * n
        if p.mining_type != "NONE":
            negatives = self.mine(conf, gt, matches, overlaps, priors, loc_host)
        self.num_matches = multibox.count_matches(matches)
        self.outer, self.inner = n, num_priors  # FULL: every prior of every image; VALID: the matched pairs
        self.norm = self.normalizer(self.num_matches)
        if self.batch_group is not None and self.normalization == "VALID" and getattr(self.batch_group, "armed", True):
            # replicas of one batch divide by the whole batch's matches, times the replicas: the mean of their
            # gradients is then one process's
            total = float(self.batch_group.sum([self.num_matches])[0])
            self.norm = max(1.0, total) / self.batch_group.count
        loc_loss = self.location_loss(loc, matches, gt, priors, loc_host)
        conf_loss = self.confidence_loss(conf, matches, negatives, gt, n)
        loss = (p.loc_weight * loc_loss if self.learns[0] else 0.0) + (conf_loss if self.learns[1] else 0.0)
        top[0].data[...] = loss / self.norm

    def ground_truth(self, blob, n):
        """The ground truth per image (multibox.ground_truth), labels checked, object classes mapped to one with
        ``map_object_to_agnostic``."""
        p, where = self.p, f"layer '{self.name}' (MultiBoxLoss)"
        gt = multibox.ground_truth(to_numpy(blob.data), p.background_label_id, p.use_difficult_gt, where)
        for i, boxes in gt.items():
            if not 0 <= i < n:
                raise DataError(f"{where}: the ground truth names image {i} of a batch of {n}")
            if p.map_object_to_agnostic:
                boxes[:, 0] = p.background_label_id + 1
            labels = boxes[:, 0]
            bad = (labels < 0) | (labels >= p.num_classes)
            if bad.any():
                raise DataError(f"{where}: image {i} of the batch has a box of label {int(labels[bad][0])}, outside "
                                f"[0, num_classes {p.num_classes})")
        return gt

    def mine(self, conf, gt, matches, overlaps, priors, loc_host):
        """The negatives (and, for HARD_EXAMPLE, the positives kept) by the loss of each prior."""
        p, n, num_priors = self.p, len(matches), self.num_priors
        labels = multibox.matched_labels(matches, gt, n, num_priors, p.background_label_id)
        losses = multibox.conf_loss(conf, self.conf_targets(labels.reshape(-1)), p.conf_loss_type)
        losses = to_numpy(losses).reshape(n, num_priors).astype(numpy.float32)
        if p.mining_type == "HARD_EXAMPLE":
            image, prior, slot, target, keep, divisor = multibox.encode_matches(matches, gt, priors[0], priors[1],
                                                                                loc_host, p)
            d = keep * (loc_host[image, prior, slot] / divisor - target)
            losses[image, prior] += multibox.loc_loss(d, p.loc_loss_type).sum(axis=1)
        return multibox.mine_hard_examples(losses, matches, overlaps, priors[0], priors[1], loc_host, p)

    def conf_targets(self, labels):
        """The confidence targets of class indices ``labels`` (host, -1 for none) on the layer's device: the indices
        for SOFTMAX, 0/1 rows for LOGISTIC."""
        labels = self.xp.asarray(labels)
        if self.p.conf_loss_type == "SOFTMAX":
            return labels
        return multibox.onehot(self.xp, labels, self.p.num_classes, self.dtype)

    def location_loss(self, loc, matches, gt, priors, loc_host):
        """The summed location loss of the matched pairs; keeps their rows and gradient for backward."""
        xp, p = self.xp, self.p
        image, prior, slot, target, keep, divisor = multibox.encode_matches(matches, gt, priors[0], priors[1],
                                                                            loc_host, p)
        self.loc_rows = tuple(xp.asarray(a) for a in (image, prior, slot))
        keep, divisor = xp.asarray(keep, self.dtype), xp.asarray(divisor, self.dtype)
        d = keep * (loc[self.loc_rows] / divisor - xp.asarray(target, self.dtype))
        self.loc_grad = p.loc_weight * multibox.loc_loss_gradient(d, p.loc_loss_type) * keep
        if p.exact_gradient:  # d's derivative by loc, which the fork's Backward_cpu leaves out (it copies d's diff)
            self.loc_grad = self.loc_grad / divisor
        return float(multibox.loc_loss(d, p.loc_loss_type).sum())

    def confidence_loss(self, conf, matches, negatives, gt, n):
        """The summed confidence loss of the scored priors; keeps their rows and gradient for backward."""
        p, num_priors = self.p, self.num_priors
        if p.mining_type != "NONE":
            rows, labels = [], []
            for i, per_image in enumerate(matches):
                for found in per_image.values():
                    j = numpy.flatnonzero(found >= 0)
                    rows.append(i * num_priors + j)
                    labels.append(gt[i][found[j], 0].astype(numpy.int64) if len(j) else j)
                rows.append(i * num_priors + negatives[i])
                background = p.background_label_id if 0 <= p.background_label_id < p.num_classes else -1
                labels.append(numpy.full(len(negatives[i]), background, numpy.int64))
            rows, labels = numpy.concatenate(rows), numpy.concatenate(labels)
            target = self.conf_targets(labels)
        else:  # every prior scores; a prior matched in several classes takes the last (the fork writes in turn)
            rows = numpy.arange(n * num_priors)
            labels = numpy.full(n * num_priors, p.background_label_id if p.conf_loss_type == "SOFTMAX" else -1)
            hot = numpy.zeros((n * num_priors, p.num_classes), bool)
            for i, per_image in enumerate(matches):
                for found in per_image.values():
                    j = numpy.flatnonzero(found >= 0)
                    labels[i * num_priors + j] = gt[i][found[j], 0]
                    hot[i * num_priors + j, gt[i][found[j], 0].astype(numpy.int64)] = True
            target = self.xp.asarray(labels) if p.conf_loss_type == "SOFTMAX" else self.xp.asarray(hot, self.dtype)
        self.conf_rows = self.xp.asarray(rows)
        x = conf[self.conf_rows]
        self.conf_grad = multibox.conf_loss_gradient(x, target, p.conf_loss_type)
        return float(multibox.conf_loss(x, target, p.conf_loss_type).sum()) if len(rows) else 0.0

    def backward(self, top, propagate_down, bottom):
        self.refuse_label_gradient(propagate_down)
        scale = top[0].diff.reshape(-1)[0] / self.norm
        n = bottom[0].shape[0]
        if propagate_down[0]:
            bottom[0].diff[...] = 0
            bottom[0].diff.reshape(n, self.num_priors, self.loc_classes, 4)[self.loc_rows] = self.loc_grad * scale
        if propagate_down[1]:
            bottom[1].diff[...] = 0
            bottom[1].diff.reshape(-1, self.p.num_classes)[self.conf_rows] = self.conf_grad * scale
