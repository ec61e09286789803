"""DetectionEvaluate (the SSD fork's test_detection_evaluate_layer.cpp), and its mAP against an independent
evaluator on random detections."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import DataError
from layerforge.kernels.average_precision import DetectionScores, average_precision
from layerforge.layers import create_layer
from layerforge.testing import make_blob

GT = [[0, 1, 0, 0.1, 0.1, 0.3, 0.3, 0], [0, 1, 0, 0.6, 0.6, 0.8, 0.8, 1], [1, 2, 0, 0.3, 0.3, 0.6, 0.5, 0],
      [1, 1, 0, 0.7, 0.1, 0.9, 0.3, 0]]
DET = [[0, 1, 0.3, 0.1, 0.0, 0.4, 0.3], [0, 1, 0.7, 0.0, 0.1, 0.2, 0.3], [0, 1, 0.9, 0.7, 0.6, 0.8, 0.8],
       [1, 2, 0.8, 0.2, 0.1, 0.4, 0.4], [1, 2, 0.1, 0.4, 0.3, 0.7, 0.5], [1, 1, 0.2, 0.8, 0.1, 1.0, 0.3],
       [1, 3, 0.2, 0.8, 0.1, 1.0, 0.3], [2, 1, 0.2, 0.8, 0.1, 1.0, 0.3]]


def evaluate(det, gt, xp=numpy, **options):
    layer = create_layer({"type": "DetectionEvaluate", "detection_evaluate": dict(
        {"num_classes": 3, "background_label_id": 0, "overlap_threshold": 0.3}, **options)}, xp=xp)
    bottom = [make_blob(numpy.asarray(det, numpy.float32).reshape(1, 1, -1, 7), numpy.float32, xp),
              make_blob(numpy.asarray(gt, numpy.float32).reshape(1, 1, -1, 8), numpy.float32, xp)]
    top = [Blob((1,), numpy.float32, xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return to_numpy(top[0].data)


@pytest.mark.parametrize("difficult, rows", [
    (True, ["-1 1 3 -1 -1", "-1 2 1 -1 -1", "0 1 0.9 1 0", "0 1 0.7 1 0", "0 1 0.3 0 1", "1 1 0.2 1 0",
            "1 2 0.8 0 1", "1 2 0.1 1 0", "1 3 0.2 0 1", "2 1 0.2 0 1"]),
    (False, ["-1 1 2 -1 -1", "-1 2 1 -1 -1", "0 1 0.9 0 0", "0 1 0.7 1 0", "0 1 0.3 0 1", "1 1 0.2 1 0",
             "1 2 0.8 0 1", "1 2 0.1 1 0", "1 3 0.2 0 1", "2 1 0.2 0 1"]),
])
def test_forward_fork_vectors(xp, difficult, rows):
    out = evaluate(DET, GT, xp, evaluate_difficult_gt=difficult)
    assert out.shape == (1, 1, len(DET) + 2, 5)
    numpy.testing.assert_allclose(out.reshape(-1, 5), [[float(v) for v in r.split()] for r in rows], atol=1e-6)


def test_background_label_is_refused():
    with pytest.raises(DataError, match="found the background label 0 in the detection results"):
        evaluate([[0, 0, 0.5, 0.1, 0.1, 0.2, 0.2]], GT)


def test_pixel_evaluation_with_name_size_file(tmp_path):
    """Normalized the overlap is 0.16 / 0.25 = 0.64; in pixels of a 10 x 10 image (+1 on each extent) 25 / 36 = 0.69:
    a true positive at 0.67 only in pixels."""
    sizes = tmp_path / "sizes.txt"
    sizes.write_text("a 10 10\n")
    det, gt = [[0, 1, 0.9, 0.1, 0.1, 0.5, 0.5]], [[0, 1, 0, 0.1, 0.1, 0.6, 0.6, 0]]
    assert evaluate(det, gt, overlap_threshold=0.67)[0, 0, 2, 3] == 0
    assert evaluate(det, gt, overlap_threshold=0.67, name_size_file=str(sizes))[0, 0, 2, 3] == 1


def reference_map(dets, gts, num_classes, threshold):
    """An independent VOC-style evaluator, written from the definition (greedy matching by descending score over
    all images of a class, each box matched once; AP the area under the interpolated precision: VOC2012's, the
    fork's MaxIntegral), to compare the layer and the accumulator against. Not pycocotools or torchmetrics: both
    interpolate at 101 recall points (COCO's definition), which none of the fork's ap_versions is."""
    aps = []
    for c in range(1, num_classes):
        gt_c = [(i, g) for i, g in enumerate(gts) for g in g if g[0] == c]
        dets_c = sorted([(d[1], i, d[2:]) for i, d_list in enumerate(dets) for d in d_list if d[0] == c],
                        key=lambda t: -t[0])
        used, tp = set(), []
        for score, i, box in dets_c:
            cands = [(k, g) for k, (j, g) in enumerate(gt_c) if j == i]
            best, best_k = 0.0, None
            for k, g in cands:
                ix = max(0.0, min(box[2], g[3]) - max(box[0], g[1]))
                iy = max(0.0, min(box[3], g[4]) - max(box[1], g[2]))
                inter = ix * iy
                union = (box[2] - box[0]) * (box[3] - box[1]) + (g[3] - g[1]) * (g[4] - g[2]) - inter
                if union > 0 and inter / union > best:
                    best, best_k = inter / union, k
            hit = best >= threshold and best_k not in used
            if hit:
                used.add(best_k)
            tp.append(hit)
        if not gt_c:
            aps.append(0.0)
            continue
        tp = numpy.array(tp, float)
        ctp, cfp = numpy.cumsum(tp), numpy.cumsum(1 - tp)
        rec, prec = ctp / len(gt_c), ctp / numpy.maximum(ctp + cfp, 1)
        mrec = numpy.concatenate([[0], rec, [1]])
        mpre = numpy.concatenate([[0], prec, [0]])
        for k in range(len(mpre) - 2, -1, -1):
            mpre[k] = max(mpre[k], mpre[k + 1])
        steps = numpy.flatnonzero(mrec[1:] != mrec[:-1])
        aps.append(float(((mrec[steps + 1] - mrec[steps]) * mpre[steps + 1]).sum()))
    return float(numpy.mean(aps))


@pytest.mark.parametrize("seed", range(4))
def test_map_agrees_with_an_independent_evaluator(seed):
    """Random ground truth and jittered random detections over 20 images in 4 classes: the layer's rows, summed by
    DetectionScores into MaxIntegral mAP, equal the reference evaluator's (float64 boxes on both sides)."""
    r = numpy.random.default_rng(seed)
    gts, dets, scores = [], [], DetectionScores()
    for image in range(20):
        g = []
        for _ in range(r.integers(0, 4)):
            x, y, w, h = r.uniform(0, 0.6), r.uniform(0, 0.6), r.uniform(0.1, 0.4), r.uniform(0.1, 0.4)
            g.append([int(r.integers(1, 4)), x, y, x + w, y + h])
        d = []
        for box in g:
            if r.uniform() < 0.8:
                jitter = r.normal(0, 0.04, 4)
                label = box[0] if r.uniform() < 0.85 else int(r.integers(1, 4))
                d.append([label, r.uniform(), *(numpy.array(box[1:]) + jitter)])
        for _ in range(r.integers(0, 3)):
            x, y = r.uniform(0, 0.7, 2)
            d.append([int(r.integers(1, 4)), r.uniform(), x, y, x + 0.2, y + 0.2])
        gts.append(g)
        dets.append(d)
        det_rows = [[image, *row] for row in d] or [[-1, -1, -1, -1, -1, -1, -1]]
        gt_rows = [[image, b[0], 0, *b[1:], 0] for b in g] or [[-1] * 8]
        layer = create_layer({"type": "DetectionEvaluate", "detection_evaluate": {
            "num_classes": 4, "overlap_threshold": 0.5}}, dtype=numpy.float64)
        bottom = [make_blob(numpy.reshape(det_rows, (1, 1, -1, 7))), make_blob(numpy.reshape(gt_rows, (1, 1, -1, 8)))]
        top = [Blob((1,), numpy.float64)]
        layer.setup(bottom, top)
        layer.forward(bottom, top)
        scores.add(top[0].data)
    assert scores.mean_ap("MaxIntegral") == pytest.approx(reference_map(dets, gts, 4, 0.5), abs=1e-6)


def test_ap_fork_vectors():
    """The fork's TestComputeAP (and TestCumSum's order: equal scores keep their order)."""
    s = numpy.float32([1.0, 1.0, .9, .9, .8, .7, .7, .6, .5, .4, .4])
    t = [0, 1, 1, 0, 1, 0, 1, 0, 0, 0, 1]
    for version, full in (("Integral", 0.558528), ("MaxIntegral", 0.591861), ("11point", 0.598662)):
        assert average_precision(s, t, 5, version) == pytest.approx(full, abs=1e-5)
        cut = 5 / 11 * (2 / 11 if version == "11point" else 0.2)
        assert average_precision(s[:7], t[:7], 5, version) == pytest.approx(full - cut, abs=1e-5)


def test_detection_scores_map_counts_classes_without_detections(caplog):
    scores = DetectionScores()
    scores.add([[-1, 1, 2, -1, -1], [-1, 2, 1, -1, -1], [0, 1, 0.9, 1, 0], [0, 1, 0.5, 1, 0], [0, 1, 0.4, 0, 0]])
    assert scores.average_precisions() == {1: 1.0, 2: 0.0}
    assert scores.mean_ap() == 0.5 and "Missing true_pos for label: 2" in caplog.text
    merged = DetectionScores()
    merged.add(scores.rows())
    assert merged.mean_ap("11point") == scores.mean_ap("11point")
