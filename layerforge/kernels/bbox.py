"""Bounding-box arithmetic of SSD (weiliu89/caffe, branch ssd, util/bbox_util.cpp) for numpy and cupy arrays.

A box is the last axis of an array, ``[xmin, ymin, xmax, ymax]``; every function broadcasts over the axes
before it, so ``jaccard_overlap(a[:, None], b[None])`` is the (N, M) table of two box lists. Normalized boxes
are fractions of the image, [0, 1]; unnormalized ones are pixel coordinates whose extents count both end
pixels (``xmax - xmin + 1``), as the fork's ``BBoxSize(bbox, normalized=false)``. Each prior box comes with
four variances. ``code_type`` is one of ``CODE_TYPES`` (``PriorBoxParameter.CodeType``).

The greedy suppression (:func:`non_maximum_suppression`, :func:`detections`) is sequential and decided box by
box: it runs on host arrays, as the fork's own GPU DetectionOutput copies boxes and scores to the host for
``ApplyNMSFast``; the box arithmetic it calls is the same array code.
"""
import numpy

from ..backend import get_array_module, to_numpy

CODE_TYPES = ("CORNER", "CENTER_SIZE", "CORNER_SIZE")


def bbox_size(boxes, normalized=True):
    """Area of each box, 0 for a box with xmax < xmin or ymax < ymin.

    Args:
        boxes: (..., 4) array.
        normalized: False for pixel boxes, whose width and height are ``xmax - xmin + 1``, ``ymax - ymin + 1``.
    Returns:
        (...) array of ``boxes``' dtype.
    """
    w, h = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
    size = w * h if normalized else (w + 1) * (h + 1)
    return size * ((w >= 0) & (h >= 0))


def intersect_bbox(a, b):
    """The intersection box of ``a`` and ``b`` (broadcast), ``[0, 0, 0, 0]`` where they are disjoint."""
    xp = get_array_module(a, b)
    disjoint = (b[..., 0] > a[..., 2]) | (b[..., 2] < a[..., 0]) | (b[..., 1] > a[..., 3]) | (b[..., 3] < a[..., 1])
    inside = xp.concatenate([xp.maximum(a[..., :2], b[..., :2]), xp.minimum(a[..., 2:], b[..., 2:])], axis=-1)
    return inside * ~disjoint[..., None]


def jaccard_overlap(a, b, normalized=True):
    """Intersection over union of ``a`` and ``b`` (broadcast): (...) array, 0 for boxes that do not overlap.

    ``normalized=False`` counts the intersection in pixels (+1 on each extent) but the two areas as normalized,
    as the fork does; its pixel intersection of two disjoint boxes is the 1 x 1 box of the corner (0, 0).
    """
    xp = get_array_module(a, b)
    inter = intersect_bbox(a, b)
    pixel = 0 if normalized else 1
    w, h = inter[..., 2] - inter[..., 0] + pixel, inter[..., 3] - inter[..., 1] + pixel
    inter_size = w * h
    overlapping = (w > 0) & (h > 0)
    union = bbox_size(a) + bbox_size(b) - inter_size
    return xp.where(overlapping, inter_size / xp.where(overlapping, union, 1), 0).astype(inter.dtype)


def bbox_coverage(a, b):
    """The fraction of ``a``'s area that ``b`` covers (broadcast); 0 where they do not overlap."""
    xp = get_array_module(a, b)
    inter_size = bbox_size(intersect_bbox(a, b))
    covered = inter_size > 0
    return xp.where(covered, inter_size / xp.where(covered, bbox_size(a), 1), 0).astype(inter_size.dtype)


def clip_bbox(boxes, height=1.0, width=1.0):
    """Boxes with x clamped to [0, width] and y to [0, height] (the unit square by default)."""
    xp = get_array_module(boxes)
    upper = xp.asarray([width, height, width, height], dtype=boxes.dtype)
    return xp.minimum(xp.maximum(boxes, 0), upper)


def _center_size(boxes):
    """``(cx, cy, w, h)``, each (...), of corner boxes."""
    w, h = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
    return (boxes[..., 0] + boxes[..., 2]) / 2, (boxes[..., 1] + boxes[..., 3]) / 2, w, h


def _check_code_type(code_type):
    if code_type not in CODE_TYPES:
        raise ValueError(f"unknown code type {code_type!r}; one of {', '.join(CODE_TYPES)}")


def encode_bbox(priors, variances, code_type, encode_variance_in_target, boxes):
    """The offsets of ``boxes`` from their ``priors`` (the fork's EncodeBBox), the regression targets.

    Args:
        priors: (..., 4) prior boxes; variances: (..., 4), ignored when ``encode_variance_in_target``.
        code_type: CORNER (corner differences), CENTER_SIZE (centre shift over the prior's size and the
            log of the size ratio) or CORNER_SIZE (corner differences over the prior's size).
        encode_variance_in_target: True leaves the variances out (the net learns the scaled offsets); False
            divides each offset by its variance.
        boxes: (..., 4), broadcast against ``priors``.
    Returns:
        (..., 4) offsets.
    """
    xp = get_array_module(priors, boxes)
    _check_code_type(code_type)
    if code_type == "CENTER_SIZE":
        pcx, pcy, pw, ph = _center_size(priors)
        bcx, bcy, bw, bh = _center_size(boxes)
        offsets = xp.stack([(bcx - pcx) / pw, (bcy - pcy) / ph, xp.log(bw / pw), xp.log(bh / ph)], axis=-1)
    else:
        offsets = boxes - priors
        if code_type == "CORNER_SIZE":
            _, _, pw, ph = _center_size(priors)
            offsets = offsets / xp.stack([pw, ph, pw, ph], axis=-1)
    return offsets if encode_variance_in_target else offsets / variances


def decode_bbox(priors, variances, code_type, variance_encoded_in_target, offsets, clip=False):
    """The boxes that ``offsets`` from ``priors`` stand for (the fork's DecodeBBox): the inverse of encode_bbox.

    Args:
        priors, variances: (..., 4); the variances scale the offsets unless ``variance_encoded_in_target``.
        offsets: (..., 4), broadcast against ``priors`` (e.g. (N, P, 4) against (P, 4)).
        clip: clamp the decoded boxes to the unit square.
    Returns:
        (..., 4) boxes.
    """
    xp = get_array_module(priors, offsets)
    _check_code_type(code_type)
    d = offsets if variance_encoded_in_target else offsets * variances
    if code_type == "CENTER_SIZE":
        pcx, pcy, pw, ph = _center_size(priors)
        cx, cy = d[..., 0] * pw + pcx, d[..., 1] * ph + pcy
        w, h = xp.exp(d[..., 2]) * pw, xp.exp(d[..., 3]) * ph
        boxes = xp.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    elif code_type == "CORNER_SIZE":
        _, _, pw, ph = _center_size(priors)
        boxes = priors + d * xp.stack([pw, ph, pw, ph], axis=-1)
    else:
        boxes = priors + d
    return clip_bbox(boxes) if clip else boxes


def top_scores(scores, threshold, top_k=-1):
    """Indices of the ``scores`` above ``threshold``, highest score first (equal scores in index order), at most
    ``top_k`` of them (-1: all): the fork's GetMaxScoreIndex. A host (numpy) int64 array."""
    scores = to_numpy(scores)
    above = numpy.flatnonzero(scores > threshold)
    order = above[numpy.argsort(-scores[above], kind="stable")]
    return order if top_k < 0 else order[:top_k]


def non_maximum_suppression(boxes, scores, nms_threshold, score_threshold=-numpy.inf, eta=1.0, top_k=-1):
    """The boxes kept by the fork's greedy ApplyNMSFast, as host indices in the order kept (highest score first).

    Candidates are the ``top_k`` highest scores above ``score_threshold``; each is kept when its overlap with
    every box kept so far is at most the threshold. The threshold starts at ``nms_threshold``; with ``eta`` < 1
    it is multiplied by ``eta`` after each kept box while it is above 0.5 (adaptive NMS).

    Args:
        boxes: (P, 4) normalized boxes; scores: (P,).
    Returns:
        int64 numpy array of indices into ``boxes``.
    """
    boxes = to_numpy(boxes)
    order = top_scores(scores, score_threshold, top_k)
    candidates = boxes[order]
    threshold, eta = boxes.dtype.type(nms_threshold), boxes.dtype.type(eta)  # compared in the boxes' precision
    worst = numpy.full(len(order), -numpy.inf, boxes.dtype)  # each candidate's highest overlap with a kept box
    kept = []
    for i in range(len(order)):
        if worst[i] > threshold:
            continue
        kept.append(order[i])
        numpy.maximum(worst[i + 1:], jaccard_overlap(candidates[i], candidates[i + 1:]), out=worst[i + 1:])
        if eta < 1 and threshold > 0.5:
            threshold *= eta
    return numpy.asarray(kept, dtype=numpy.int64)


def detections(boxes, scores, background_label_id, nms_threshold, score_threshold=-numpy.inf, eta=1.0, top_k=-1,
               keep_top_k=-1):
    """One image's detections as the fork's DetectionOutput makes them: per-class NMS, then the best ``keep_top_k``.

    Args:
        boxes: (L, P, 4) decoded boxes, L = 1 when the classes share locations, else one set per class.
        scores: (C, P) confidences of the C classes; class ``background_label_id`` is skipped (-1: none).
        nms_threshold, score_threshold, eta, top_k: :func:`non_maximum_suppression`'s, per class.
        keep_top_k: when the classes keep more boxes than this (-1: no limit), only the highest-scoring this many.
    Returns:
        (D, 6) host array of rows ``[label, score, xmin, ymin, xmax, ymax]``, by label, each label's rows by
        descending score.
    """
    boxes, scores = to_numpy(boxes), to_numpy(scores)
    kept = []  # (label, index) in output order
    for label in range(scores.shape[0]):
        if label == background_label_id:
            continue
        class_boxes = boxes[0 if boxes.shape[0] == 1 else label]
        kept += [(label, i) for i in non_maximum_suppression(class_boxes, scores[label], nms_threshold,
                                                             score_threshold, eta, top_k)]
    if -1 < keep_top_k < len(kept):
        best = numpy.argsort([-scores[label, i] for label, i in kept], kind="stable")[:keep_top_k]
        kept = sorted((kept[k] for k in best), key=lambda pair: (pair[0], -scores[pair]))
    rows = numpy.empty((len(kept), 6), scores.dtype)
    for row, (label, i) in zip(rows, kept):
        row[0], row[1] = label, scores[label, i]
        row[2:] = boxes[0 if boxes.shape[0] == 1 else label, i]
    return rows
