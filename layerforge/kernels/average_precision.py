"""Average precision of detections (the SSD fork's ComputeAP) and the mAP its solver prints.

A detection is a (score, true positive) pair of one class; ``num_pos`` is the class's count of ground-truth
boxes. Detections are ranked by score, highest first (a stable sort: equal scores keep the order they were
listed in), and precision p_k = TP_k / k, recall r_k = TP_k / num_pos after the k best. The three
``ap_version`` s of the fork:

- ``11point`` (PASCAL VOC 2007): the mean over r in {0, 0.1, ..., 1} of max(p_k : r_k >= r) (0 where none);
- ``MaxIntegral`` (VOC 2012, ILSVRC): the area under the precision envelope max(p_j : j >= k), step by step
  in recall;
- ``Integral``: the area under the raw precision, sum_k p_k (r_k - r_{k-1}).

As in the fork, a recall step of at most 1e-6 adds nothing, and a class with no ground truth or no
detections has AP 0.
"""
import logging

import numpy

log = logging.getLogger("layerforge")

AP_VERSIONS = ("11point", "MaxIntegral", "Integral")
_EPS = 1e-6


def precision_recall(scores, true_pos, num_pos):
    """``(precision, recall)`` (float32, as the fork computes them) after each detection, best score first.

    Args:
        scores: (n,) detection scores.
        true_pos: (n,) 1 for a true positive, 0 for a false one.
        num_pos: ground-truth boxes of the class (> 0).
    """
    order = numpy.argsort(-numpy.asarray(scores, numpy.float32), kind="stable")
    tp = numpy.cumsum(numpy.asarray(true_pos, numpy.int64)[order])
    ranks = numpy.arange(1, len(order) + 1)
    precision = (tp / ranks).astype(numpy.float32)
    recall = (tp / num_pos).astype(numpy.float32)
    return precision, recall


def average_precision(scores, true_pos, num_pos, ap_version="Integral"):
    """The AP of one class's detections (``scores`` and 0/1 ``true_pos`` (n,)) against ``num_pos`` boxes."""
    if ap_version not in AP_VERSIONS:
        raise ValueError(f"unknown ap_version {ap_version!r}; the fork's are {', '.join(AP_VERSIONS)}")
    if len(scores) == 0 or num_pos == 0:
        return 0.0
    precision, recall = precision_recall(scores, true_pos, num_pos)
    p, r = precision.astype(numpy.float64), recall.astype(numpy.float64)
    if ap_version == "11point":
        points = numpy.arange(11) / 10.0
        reached = r[None, :] >= points[:, None]
        return float(numpy.where(reached, p[None, :], 0.0).max(axis=1).sum() / 11)
    if ap_version == "MaxIntegral":
        envelope = numpy.maximum.accumulate(p[::-1])[::-1]
        steps = numpy.diff(r)
        steps[numpy.abs(steps) <= _EPS] = 0.0
        return float((envelope[:-1] * steps).sum() + r[0] * envelope[0])
    steps = numpy.diff(numpy.concatenate([[0.0], r]))
    steps[numpy.abs(steps) <= _EPS] = 0.0
    return float((p * steps).sum())


class DetectionScores:
    """Gathers the rows DetectionEvaluate writes over test batches and gives the mAP, as the fork's solver does.

    A row is ``(image, label, score, tp, fp)``; a row with image -1 carries the count of ground-truth boxes of
    ``label`` in its score column, and rows with tp = fp = 0 (a detection of a difficult box that is not
    evaluated) are skipped. The mAP is the mean AP over every label that had a count row, including labels
    without detections (AP 0, with the fork's warning).
    """

    def __init__(self):
        self.num_pos = {}
        self.detections = {}  # label -> [scores list, true-positive list]

    def add(self, rows):
        """Add the (k, 5) rows of one forward of a DetectionEvaluate layer."""
        rows = numpy.asarray(rows, numpy.float64).reshape(-1, 5)
        for image, label, score, tp, fp in rows.tolist():
            label = int(label)
            if int(image) == -1:
                self.num_pos[label] = self.num_pos.get(label, 0) + int(score)
            elif int(tp) or int(fp):
                scores, hits = self.detections.setdefault(label, ([], []))
                scores.append(score)
                hits.append(int(tp))

    def rows(self):
        """The state as (k, 5) rows that :meth:`add` takes (to gather the rows of several processes)."""
        count = [(-1, label, n, -1, -1) for label, n in sorted(self.num_pos.items())]
        found = [(0, label, s, t, 1 - t) for label, (scores, hits) in sorted(self.detections.items())
                 for s, t in zip(scores, hits)]
        return numpy.array(count + found, numpy.float64).reshape(-1, 5)

    def average_precisions(self, ap_version="Integral"):
        """``{label: AP}`` for every label that had a count row."""
        aps = {}
        for label, num_pos in sorted(self.num_pos.items()):
            if label not in self.detections:
                log.warning("Missing true_pos for label: %d", label)
                aps[label] = 0.0
                continue
            scores, hits = self.detections[label]
            aps[label] = average_precision(numpy.float32(scores), hits, num_pos, ap_version)
        return aps

    def mean_ap(self, ap_version="Integral"):
        """The mean of :meth:`average_precisions` (0 when no label had a count row)."""
        aps = self.average_precisions(ap_version)
        return sum(aps.values()) / len(aps) if aps else 0.0
