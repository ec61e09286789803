"""The test phase's scores (Caffe's Solver::Test, and the SSD fork's TestDetection for ``eval_type: DETECTION``).

The solver runs the test forwards (acting on signal requests between them) and hands them to :func:`evaluate`,
which sums each output over the passes (:func:`add_up`, the one scoring loop: ``layerforge test`` hands it its
batches too) and logs Caffe's lines, which its log parsers (and layerforge/training_log.py) read::

    Test loss: 0.0312                                              (test_compute_loss)
        Test net output #0: accuracy = 0.9904
        Test net output #1: loss = 0.0312 (* 1 = 0.0312 loss)      (a loss output: its weight)

With ``eval_type: DETECTION`` each output holds DetectionEvaluate's rows (width 5), and its score is the mAP over
every pass's rows (``ap_version``; ``show_per_class_result`` logs ``class<label>: AP`` first). Data parallelism acts
through the seam: ``reduce_test(sums, loss, n)`` sums the ranks' shards, ``gather_test_rows(rows)`` gathers their
detections (an mAP is not a sum).
"""
import collections
import logging
import math

import numpy

from .. import backend
from ..errors import LayerforgeError
from ..kernels.average_precision import DetectionScores

log = logging.getLogger("layerforge")


def caffe_float(x):
    """``x`` as C++ ostream's default float format prints it, which Caffe's log lines use."""
    return format(float(x), ".6g")


class Totals:
    """A net's outputs added up over test passes (:meth:`add` after each forward): ``sums[name]``, an output's
    element-wise sum; for the outputs named in ``detection``, ``detections[name]``, every pass's DetectionEvaluate
    rows (an mAP is not a mean); ``loss``, the passes' summed loss; ``done``, the passes added. An output whose
    shape changes between passes (DetectionOutput's list) is said once and left out of ``sums``."""

    def __init__(self, detection=()):
        self.sums, self.detections = {}, {name: DetectionScores() for name in detection}
        self.loss, self.done, self.varying = 0.0, 0, set()

    def add(self, net):
        self.done += 1
        self.loss += net.loss
        for name in net.outputs:
            value = backend.to_numpy(net.blobs[name].data)
            if name in self.detections:
                if value.shape[-1:] != (5,):
                    raise LayerforgeError(f"eval_type DETECTION: test net output '{name}' has shape {value.shape}; "
                                          "each output must be DetectionEvaluate's (rows of 5)")
                self.detections[name].add(value)
                continue
            v = value.astype(numpy.float64)
            if name in self.sums and self.sums[name].shape != v.shape and name not in self.varying:
                log.info("%s changes shape between batches (%s, then %s): not averaged", name, self.sums[name].shape,
                         v.shape)
                self.varying.add(name)
            if name not in self.varying:
                self.sums[name] = self.sums.get(name, 0.0) + v


def add_up(net, passes, detection=()):
    """The :class:`Totals` of ``net``'s outputs over ``passes`` (an iterator that runs one test forward per step):
    the one scoring loop of the solver's test phase and of ``layerforge test``."""
    totals = Totals(detection)
    for _ in passes:
        totals.add(net)
    return totals


def evaluate(sp, net, passes, n, seam):
    """Score test net ``net`` over ``passes`` (an iterator running one test forward per step, ``n`` of them), as
    SolverParameter ``sp`` asks; logs the scores and returns ``{output: mean value}`` (eval_type DETECTION:
    ``{output: mAP}``), or None when the passes stopped before ``n`` (a signal asked to stop)."""
    detection = sp.eval_type == "DETECTION"
    totals = add_up(net, passes, net.outputs if detection else ())
    if totals.done < n:
        return None
    if detection:
        return _detection_scores(sp, net, totals, seam)
    outputs = [name for name in net.outputs if name in totals.sums]
    sums = [totals.sums[name].reshape(-1) for name in outputs] or None
    sums, loss, n = seam.reduce_test(sums, totals.loss, n)
    if sp.test_compute_loss:
        log.info("Test loss: %s", caffe_float(loss / n))
    means, weights = [total / n for total in sums or []], output_weights(net)
    log_outputs("Test", zip(outputs, means), weights, sp.report_perplexity)
    scores = collections.OrderedDict()
    for name, mean in zip(outputs, means):
        scores[name] = float(mean[0]) if mean.size == 1 else mean
        if sp.report_perplexity and weights.get(name) and mean.size == 1:
            scores[f"{name}_perplexity"] = math.exp(min(float(mean[0]), 700.0))
    return scores


def _detection_scores(sp, net, totals, seam):
    # the SSD fork's TestDetection: one mAP per output of the rows of every pass (and of every rank's)
    scores = {}
    for name in net.outputs:
        merged = DetectionScores()
        merged.add(seam.gather_test_rows(totals.detections[name].rows()))
        scores[name] = merged
    _, loss, n = seam.reduce_test([], totals.loss, totals.done)
    if sp.test_compute_loss:
        log.info("Test loss: %s", caffe_float(loss / n))
    result = collections.OrderedDict()
    for idx, name in enumerate(net.outputs):
        if sp.show_per_class_result:
            for label, ap in scores[name].average_precisions(sp.ap_version).items():
                log.info("class%d: %s", label, caffe_float(ap))
        result[name] = scores[name].mean_ap(sp.ap_version)
        log.info("    Test net output #%d: %s = %s", idx, name, caffe_float(result[name]))
    return result


def log_outputs(phase, outputs, weights, report_perplexity):
    """Caffe's ``    Train net output #k: name = v (* w = w v loss)`` lines (``phase``: Train or Test), one per value
    of each ``(name, values)`` of ``outputs``, numbered on across outputs; ``weights``: :func:`output_weights`."""
    k = 0
    for name, values in outputs:
        w = weights.get(name, 0.0)
        for v in values:
            extra = f" (* {caffe_float(w)} = {caffe_float(w * v)} loss)" if w else ""
            perplexity = f" (perplexity {caffe_float(math.exp(min(float(v), 700.0)))})" if report_perplexity and w \
                else ""
            log.info("    %s net output #%d: %s = %s%s%s", phase, k, name, caffe_float(v), extra, perplexity)
            k += 1


def output_weights(net):
    """``{top name: loss weight}`` of ``net``'s tops that carry a loss weight."""
    weights = {}
    for i in range(len(net.layers)):
        for name, w in zip(net.top_names(i), net.loss_weights(i)):
            if w:
                weights[name] = w
    return weights
