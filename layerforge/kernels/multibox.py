"""The training side of SSD's MultiBox loss: ground truth, matching, hard example mining and the loss per prior.

The SSD fork (weiliu89/caffe ``ssd``, ``src/caffe/util/bbox_util.cpp``) is the specification; the bookkeeping
runs on the host, as the fork's GPU MultiBoxLoss does it on the CPU, and the per-prior losses are computed
with the array module of the predictions (numpy or cupy) and brought to the host only where mining needs them.

Shapes and names: an image has P priors (boxes ``(P, 4)`` ``xmin, ymin, xmax, ymax`` in [0, 1] and variances
``(P, 4)``) and its ground truth ``(G, 6)`` rows ``label, xmin, ymin, xmax, ymax, difficult``. A *match* is,
per image, a mapping ``{label: indices (P,)}`` in ascending label order (the fork's ``std::map``): label -1
when the location is shared by the classes, else one entry per foreground class; ``indices[j]`` is the ground
truth row prior j matched (-1 none, -2 ignored as crossing the image boundary). ``overlaps`` has the same keys
and each prior's best Jaccard overlap with that label's ground truth.
"""
import numpy

from ..backend import get_array_module
from ..errors import DataError
from .bbox import bbox_size, decode_bbox, encode_bbox, jaccard_overlap, non_maximum_suppression, top_scores

FLT_MIN = float(numpy.finfo(numpy.float32).tiny)
# a prediction and a ground-truth box overlap when their Jaccard overlap exceeds this (the fork's 1e-6)
MIN_OVERLAP = 1e-6


def ground_truth(gt, background_label_id, use_difficult_gt, where="the ground truth"):
    """``{image: (G, 6) float32 rows label, xmin, ymin, xmax, ymax, difficult}`` from the (K, 8) ground-truth list
    the AnnotatedData layer writes (``image, label, instance, xmin, ymin, xmax, ymax, difficult``).

    Rows of image -1 (the placeholder of a batch without boxes) are skipped, and difficult boxes unless
    ``use_difficult_gt``; a box labelled ``background_label_id`` is a DataError naming ``where``.
    """
    gt = numpy.asarray(gt, numpy.float32).reshape(-1, 8)
    rows = gt[gt[:, 0].astype(numpy.int64) != -1]
    labels = rows[:, 1].astype(numpy.int64)
    if (labels == background_label_id).any():
        k = int(numpy.flatnonzero(labels == background_label_id)[0])
        raise DataError(f"{where}: box {k} of image {int(rows[k, 0])} has the background label "
                        f"{background_label_id} (found background label in the dataset)")
    if not use_difficult_gt:
        rows = rows[rows[:, 7] == 0]
    images = rows[:, 0].astype(numpy.int64)
    return {int(i): rows[images == i][:, [1, 3, 4, 5, 6, 7]] for i in dict.fromkeys(images.tolist())}


def match_boxes(overlaps, match_type, overlap_threshold, ignored=None):
    """Match predictions (rows of ``overlaps``) to ground-truth boxes (its columns): the fork's MatchBBox.

    First bipartite: repeatedly the largest overlap between an unmatched prediction and an unused box pairs
    them (ties: the lowest prediction, then the lowest box). Then, for PER_PREDICTION, every prediction still
    unmatched takes its best box with overlap >= ``overlap_threshold``. Overlaps of at most 1e-6 never match.

    Args:
        overlaps: (P, G) Jaccard overlaps (float32).
        match_type: "BIPARTITE" or "PER_PREDICTION".
        ignored: (P,) bool, predictions left out (index -2), or None.
    Returns:
        ``(indices (P,) int64, best (P,) float32)``: the matched column (-1 none, -2 ignored) and each
        prediction's largest overlap (0 for an ignored one).
    """
    overlaps = numpy.asarray(overlaps, numpy.float32)
    num_pred, num_gt = overlaps.shape
    indices = numpy.full(num_pred, -1, numpy.int64)
    best = numpy.zeros(num_pred, numpy.float32)
    if num_gt == 0:
        return indices, best
    usable = overlaps > MIN_OVERLAP
    if ignored is not None:
        indices[ignored] = -2
        usable[ignored] = False
    best[:] = numpy.where(usable, overlaps, 0).max(axis=1)
    pool = usable.copy()
    for _ in range(num_gt):
        candidates = numpy.where(pool, overlaps, -1.0)
        k = int(candidates.argmax())  # the first of equal maxima in (prediction, box) order, as the fork's scan
        i, j = divmod(k, num_gt)
        if candidates[i, j] < 0:
            break
        indices[i], best[i] = j, overlaps[i, j]
        pool[i, :] = False
        pool[:, j] = False
    if match_type == "PER_PREDICTION":
        eligible = usable & (overlaps >= overlap_threshold) & (indices == -1)[:, None]
        candidates = numpy.where(eligible, overlaps, -1.0)
        j = candidates.argmax(axis=1)
        found = candidates[numpy.arange(num_pred), j] >= 0
        indices[found] = j[found]
        best[found] = overlaps[found, j[found]]
    return indices, best


def overlap_table(a, b):
    """(len(a), len(b)) Jaccard overlaps of two box lists."""
    return jaccard_overlap(a[:, None], b[None])


def loss_nms(boxes, loss, threshold, top_k):
    """The fork's ApplyNMS as mining uses it: among the ``top_k`` (-1: all) boxes of largest ``loss``, boxes of area
    below 1e-5 are dropped and the rest suppressed greedily (overlap above ``threshold``); host indices of the
    boxes kept, largest loss first."""
    order = top_scores(loss, -numpy.inf, top_k)
    order = order[bbox_size(boxes[order]) >= 1e-5]
    return order[non_maximum_suppression(boxes[order], loss[order], threshold)]


def cross_boundary(boxes):
    """(P,) bool: boxes with a coordinate outside [0, 1]."""
    return ((boxes < 0) | (boxes > 1)).any(axis=1)


def find_matches(gt, priors, variances, loc_host, p, num_images):
    """The fork's FindMatches: ``(matches, overlaps)``, one mapping per image (see the module docstring).

    Args:
        gt: :func:`ground_truth`'s mapping.
        priors, variances: (P, 4) each.
        loc_host: (N, P, L, 4) location predictions on the host, needed only when
            ``p.use_prior_for_matching`` is false (then the decoded predictions are matched), else None.
        p: the MultiBoxLoss parameters (``num_classes``, ``share_location``, ``match_type``,
            ``overlap_threshold``, ``use_prior_for_matching``, ``background_label_id``, ``code_type``,
            ``encode_variance_in_target``, ``ignore_cross_boundary_bbox``).
    """
    loc_classes = 1 if p.share_location else p.num_classes
    all_matches, all_overlaps = [], []
    for i in range(num_images):
        matches, overlaps = {}, {}
        boxes = gt.get(i)
        if boxes is None:
            all_matches.append(matches)
            all_overlaps.append(overlaps)
            continue
        if not p.use_prior_for_matching:
            for c in range(loc_classes):
                label = -1 if p.share_location else c
                if not p.share_location and label == p.background_label_id:
                    continue
                predicted = decode_bbox(priors, variances, p.code_type, p.encode_variance_in_target,
                                        loc_host[i, :, c])
                columns = numpy.arange(len(boxes)) if label == -1 else numpy.flatnonzero(boxes[:, 0] == label)
                ignored = cross_boundary(predicted) if p.ignore_cross_boundary_bbox else None
                found, best = match_boxes(overlap_table(predicted, boxes[columns, 1:5]), p.match_type,
                                          p.overlap_threshold, ignored)
                matches[label] = found.copy()
                matches[label][found >= 0] = columns[found[found >= 0]]
                overlaps[label] = best
        else:
            ignored = cross_boundary(priors) if p.ignore_cross_boundary_bbox else None
            found, best = match_boxes(overlap_table(priors, boxes[:, 1:5]), p.match_type, p.overlap_threshold,
                                      ignored)
            if p.share_location:
                matches[-1], overlaps[-1] = found, best
            else:
                labels = boxes[:, 0].astype(numpy.int64)
                for c in range(loc_classes):
                    if c == p.background_label_id:
                        continue
                    own = (found >= 0) & (labels[numpy.maximum(found, 0)] == c)
                    matches[c] = numpy.where(own, found, -1)
                    overlaps[c] = best
        all_matches.append(matches)
        all_overlaps.append(overlaps)
    return all_matches, all_overlaps


def count_matches(matches):
    """The number of matched (prior, label) pairs of all images."""
    return sum(int((m >= 0).sum()) for per_image in matches for m in per_image.values())


def matched_labels(matches, gt, num_images, num_priors, background_label_id):
    """(N, P) int64: the class each prior's confidence is scored against when mining: the label of its matched
    box (the first label entry that matched it), else the background."""
    labels = numpy.full((num_images, num_priors), background_label_id, numpy.int64)
    for i, per_image in enumerate(matches):
        open_ = numpy.ones(num_priors, bool)
        for found in per_image.values():
            hit = open_ & (found >= 0)
            if hit.any():
                labels[i, hit] = gt[i][found[hit], 0].astype(numpy.int64)
            open_ &= ~hit
    return labels


def onehot(xp, labels, num_classes, dtype):
    """(R, C) 0/1 targets of ``dtype`` from class indices ``labels`` (R,) (an array of ``xp``); -1 gives a row of
    zeros."""
    return (xp.arange(num_classes)[None, :] == labels[:, None]).astype(dtype)


def conf_loss(x, target, loss_type):
    """The confidence loss of each row of scores ``x`` (R, C): SOFTMAX -log softmax(x)[target] for class indices
    ``target`` (R,) (the probability floored at FLT_MIN); LOGISTIC the sigmoid cross entropy summed over the
    classes against 0/1 targets ``target`` (R, C) (:func:`onehot`). Arrays of one module (numpy or cupy)."""
    xp = get_array_module(x)
    if loss_type == "SOFTMAX":
        e = xp.exp(x - x.max(axis=1, keepdims=True))
        prob = e[xp.arange(x.shape[0]), target] / e.sum(axis=1)
        return -xp.log(xp.maximum(prob, FLT_MIN))
    positive = (x >= 0).astype(x.dtype)
    return -(x * (target - positive) - xp.log1p(xp.exp(x - 2 * x * positive))).sum(axis=1)


def conf_loss_gradient(x, target, loss_type):
    """d conf_loss / d x, row by row (R, C): softmax(x) - onehot(target), or sigmoid(x) - target."""
    xp = get_array_module(x)
    if loss_type == "SOFTMAX":
        e = xp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True) - onehot(xp, target, x.shape[1], x.dtype)
    return 1 / (1 + xp.exp(-x)) - target


def loc_loss(d, loss_type):
    """Elementwise location loss of the differences ``d`` = prediction - target: SMOOTH_L1 0.5 d^2 where
    |d| < 1 else |d| - 0.5; L2 0.5 d^2."""
    xp = get_array_module(d)
    if loss_type == "L2":
        return 0.5 * d * d
    a = xp.abs(d)
    return xp.where(a < 1, 0.5 * d * d, a - 0.5)


def loc_loss_gradient(d, loss_type):
    """d loc_loss / d d: d (L2, and SMOOTH_L1 where |d| < 1), else sign(d)."""
    xp = get_array_module(d)
    return d if loss_type == "L2" else xp.where(xp.abs(d) < 1, d, xp.sign(d))


def encode_matches(matches, gt, priors, variances, loc_host, p):
    """The matched pairs in the fork's order (image, then label, then prior) and their regression targets.

    The loss of pair m is ``loc_loss(keep * (loc[image, prior, slot] / divisor - target))``.

    Args:
        loc_host: (N, P, L, 4) location predictions on the host; needed only for ``bp_inside`` without
            ``use_prior_for_matching`` (the decoded prediction tells which coordinates leave the image).
    Returns:
        ``(image, prior, slot, target, keep, divisor)``: int64 (M,) arrays (``slot`` the location class, 0 when
        shared); the encoded ground truth (M, 4) float32 (divided by the variance with
        ``encode_variance_in_target``); ``keep`` (M, 4) bool, False for a coordinate ``bp_inside`` takes out of
        the loss (outside the image: the fork puts the target in place of the prediction); ``divisor`` (M, 4)
        float32, the variance with ``encode_variance_in_target`` (EncodeLocPrediction divides prediction and
        target by it), else 1.
    """
    image, prior, slot, box = [], [], [], []
    for i, per_image in enumerate(matches):
        for label, found in per_image.items():
            j = numpy.flatnonzero(found >= 0)
            image.append(numpy.full(len(j), i))
            prior.append(j)
            slot.append(numpy.full(len(j), 0 if p.share_location else label))
            box.append(gt[i][found[j], 1:5])
    image, prior, slot = (numpy.concatenate(a).astype(numpy.int64) if a else numpy.zeros(0, numpy.int64)
                          for a in (image, prior, slot))
    box = numpy.concatenate(box).astype(numpy.float32) if box else numpy.zeros((0, 4), numpy.float32)
    target = encode_bbox(priors[prior], variances[prior], p.code_type, p.encode_variance_in_target,
                         box).astype(numpy.float32)
    keep = numpy.ones(target.shape, bool)
    if p.bp_inside:
        region = priors[prior] if p.use_prior_for_matching else decode_bbox(
            priors[prior], variances[prior], p.code_type, p.encode_variance_in_target, loc_host[image, prior, slot])
        keep = (region >= 0) & (region <= 1)
    divisor = numpy.ones(target.shape, numpy.float32)
    if p.encode_variance_in_target:
        divisor = variances[prior].astype(numpy.float32)
        target = target / divisor
    return image, prior, slot, target, keep, divisor


def _eligible(mining_type, found, overlap, neg_overlap):
    if mining_type == "MAX_NEGATIVE":
        return (found == -1) & (overlap < neg_overlap)
    return numpy.ones(len(found), bool)


def mine_hard_examples(losses, matches, overlaps, priors, variances, loc_host, p):
    """The fork's MineHardExamples: pick, per image, the negatives (MAX_NEGATIVE) or the hard examples
    (HARD_EXAMPLE) of largest loss. ``matches`` is updated in place (HARD_EXAMPLE unmatches the positives it
    does not pick).

    Args:
        losses: (N, P) float32 on the host: each prior's confidence loss, plus for HARD_EXAMPLE its location
            loss (0 for unmatched priors).
        p: MultiBoxLoss parameters (``mining_type``, ``neg_pos_ratio``, ``neg_overlap``, ``sample_size``,
            ``nms_param``, ``use_prior_for_nms``, ...).
    Returns:
        ``negatives``: per image, the chosen negative priors in ascending order (int64 arrays).
    """
    negatives = []
    nms_param = p.nms_param if p.given("nms_param") else None
    for i, per_image in enumerate(matches):
        chosen_negatives = []
        for label, found in per_image.items():
            eligible = numpy.flatnonzero(_eligible(p.mining_type, found, overlaps[i][label], p.neg_overlap))
            count = len(eligible)
            if p.mining_type == "MAX_NEGATIVE":
                count = min(int(int((found > -1).sum()) * numpy.float32(p.neg_pos_ratio)), count)
            else:
                count = min(p.sample_size, count)
            loss = losses[i, eligible]
            if nms_param is not None and nms_param.nms_threshold > 0:
                boxes = priors if p.use_prior_for_nms else decode_bbox(
                    priors, variances, p.code_type, p.encode_variance_in_target,
                    loc_host[i, :, 0 if p.share_location else label])
                kept = loss_nms(boxes[eligible], loss, nms_param.nms_threshold,
                                nms_param.top_k if nms_param.top_k is not None else -1)
                picked = eligible[kept[:count]]
            else:
                order = numpy.argsort(-loss, kind="stable")
                picked = eligible[order[:count]]
            selected = numpy.zeros(len(found), bool)
            selected[picked] = True
            if p.mining_type == "HARD_EXAMPLE":
                found[(found > -1) & ~selected] = -1
            chosen_negatives.append(numpy.flatnonzero((found == -1) & selected))
        negatives.append(numpy.concatenate(chosen_negatives) if chosen_negatives else numpy.zeros(0, numpy.int64))
    return negatives
