"""The training-side box bookkeeping of SSD (layerforge/kernels/multibox.py) on the fork's test_bbox_util.cpp
vectors: matching, ground truth, confidence losses."""
import math

import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.errors import DataError
from layerforge.kernels import multibox

# the fork's FillBBoxes: two ground-truth boxes (labels 1, 2) and six predictions, with the overlaps noted
GT = numpy.array([[1, 0.1, 0.1, 0.3, 0.3, 0], [2, 0.3, 0.3, 0.6, 0.5, 0]], numpy.float32)
PRED = numpy.array([[0.1, 0, 0.4, 0.3], [0, 0.1, 0.2, 0.3], [0.2, 0.1, 0.4, 0.4], [0.4, 0.3, 0.7, 0.5],
                    [0.5, 0.4, 0.7, 0.7], [0.7, 0.7, 0.8, 0.8]], numpy.float32)


def match(label, match_type, threshold):
    """MatchBBox(gt, pred, label, ...): columns restricted to ``label`` (-1: all), indices into GT."""
    columns = numpy.arange(len(GT)) if label == -1 else numpy.flatnonzero(GT[:, 0] == label)
    found, best = multibox.match_boxes(multibox.overlap_table(PRED, GT[columns, 1:5]), match_type, threshold,
                                       multibox.cross_boundary(PRED))
    found[found >= 0] = columns[found[found >= 0]]
    return found, best


@pytest.mark.parametrize("label, match_type, threshold, indices, overlaps", [
    (1, "BIPARTITE", -1, [0, -1, -1, -1, -1, -1], [4 / 9, 2 / 6, 2 / 8, 0, 0, 0]),
    (-1, "BIPARTITE", -1, [0, -1, -1, 1, -1, -1], [4 / 9, 2 / 6, 2 / 8, 4 / 8, 1 / 11, 0]),
    (1, "PER_PREDICTION", 0.3, [0, 0, -1, -1, -1, -1], [4 / 9, 2 / 6, 2 / 8, 0, 0, 0]),
    (-1, "PER_PREDICTION", 0.3, [0, 0, -1, 1, -1, -1], [4 / 9, 2 / 6, 2 / 8, 4 / 8, 1 / 11, 0]),
    (-1, "PER_PREDICTION", 0.001, [0, 0, 0, 1, 1, -1], [4 / 9, 2 / 6, 2 / 8, 4 / 8, 1 / 11, 0]),
])
def test_match_bbox(label, match_type, threshold, indices, overlaps):
    found, best = match(label, match_type, threshold)
    assert found.tolist() == indices
    numpy.testing.assert_allclose(best, overlaps, atol=1e-6)


def test_match_ignores_cross_boundary_predictions():
    pred = PRED.copy()
    pred[0, 0] = -0.05  # the best match of box 0 now crosses the border
    found, best = multibox.match_boxes(multibox.overlap_table(pred, GT[:, 1:5]), "BIPARTITE", 0.5,
                                       multibox.cross_boundary(pred))
    assert found[0] == -2 and best[0] == 0
    assert found[1] == 0  # the next best prediction of box 0 takes it


def test_bipartite_ties_go_to_the_lowest_prediction():
    found, _ = multibox.match_boxes(numpy.array([[0.5], [0.5]], numpy.float32), "BIPARTITE", 0.5)
    assert found.tolist() == [0, -1]


def gt_list():
    """The fork's TestGetGroundTruth list: image ceil(i / 2), label i, difficult i % 2."""
    rows = [[math.ceil(i / 2), i, 0, 0.1, 0.1, 0.3, 0.3, i % 2] for i in range(4)]
    return numpy.array(rows, numpy.float32)


def test_get_ground_truth():
    gt = multibox.ground_truth(gt_list(), -1, True)
    assert sorted(gt) == [0, 1, 2]
    assert gt[0][:, 0].tolist() == [0] and gt[1][:, 0].tolist() == [1, 2] and gt[2][:, 0].tolist() == [3]
    assert gt[1][:, 5].tolist() == [1, 0] and gt[2][:, 5].tolist() == [1]
    numpy.testing.assert_allclose(gt[1][:, 1:5], [[0.1, 0.1, 0.3, 0.3]] * 2, atol=1e-6)
    gt = multibox.ground_truth(gt_list(), -1, False)  # difficult boxes skipped
    assert sorted(gt) == [0, 1] and gt[1][:, 0].tolist() == [2]


def test_ground_truth_refuses_the_background_label():
    with pytest.raises(DataError, match="box 0 of image 0 has the background label 0"):
        multibox.ground_truth(gt_list(), 0, True, where="layer 'loss'")


def test_ground_truth_skips_the_empty_placeholder():
    assert multibox.ground_truth(numpy.full((1, 8), -1, numpy.float32), 0, True) == {}


def conf_blob(num=2, priors=2, classes=2):
    """The fork's TestComputeConfLoss scores: sign * index * 0.1, negative for image 0."""
    idx = numpy.arange(num * priors * classes, dtype=numpy.float64).reshape(num, priors, classes)
    sign = numpy.where(numpy.arange(num) % 2, 1.0, -1.0)[:, None, None]
    return (sign * idx * 0.1).reshape(-1, classes)


def logistic(x):
    return 1 / (1 + math.exp(-x))


@pytest.mark.parametrize("background", [-1, 0])
def test_compute_conf_loss_logistic(xp, background):
    x = xp.asarray(conf_blob())
    labels = xp.full(4, background)
    loss = to_numpy(multibox.conf_loss(x, multibox.onehot(xp, labels, 2, x.dtype), "LOGISTIC"))
    values = conf_blob()
    expected = [-sum(math.log(1 - logistic(v)) if c != background else math.log(logistic(v))
                     for c, v in enumerate(row)) for row in values]
    numpy.testing.assert_allclose(loss, expected, atol=1e-6)


def test_compute_conf_loss_softmax_matched():
    """ComputeConfLossMatch: prior 0 of image 1 matched to a box of label 1, the rest background 0."""
    gt = {1: numpy.array([[1, 0, 0, 0, 0, 0]], numpy.float32)}
    matches = [{-1: numpy.array([-1, -1])}, {-1: numpy.array([0, -1])}]
    labels = multibox.matched_labels(matches, gt, 2, 2, 0)
    assert labels.tolist() == [[0, 0], [1, 0]]
    loss = multibox.conf_loss(conf_blob(), labels.reshape(-1), "SOFTMAX")
    expected = [-math.log(1 / (1 + math.exp(-0.1)))] * 2 + [-math.log(1 / (1 + math.exp(-0.1))),
                                                            -math.log(math.exp(-0.1) / (1 + math.exp(-0.1)))]
    numpy.testing.assert_allclose(loss, expected, atol=1e-6)
    loss = multibox.conf_loss(conf_blob(), multibox.onehot(numpy, labels.reshape(-1), 2, numpy.float64), "LOGISTIC")
    assert loss[2] == pytest.approx(-(math.log(logistic(-0.4)) + math.log(logistic(0.5))))  # the fork's vector


@pytest.mark.parametrize("loss_type", ["SOFTMAX", "LOGISTIC"])
def test_conf_loss_gradient_is_the_derivative(loss_type):
    x = numpy.random.default_rng(0).standard_normal((5, 3))
    target = numpy.array([0, 2, 1, -1, 0])
    t = target.clip(0) if loss_type == "SOFTMAX" else multibox.onehot(numpy, target, 3, x.dtype)
    g = multibox.conf_loss_gradient(x, t, loss_type)
    h = 1e-6
    for r, c in [(0, 0), (1, 2), (3, 1), (4, 2)]:
        plus, minus = x.copy(), x.copy()
        plus[r, c] += h
        minus[r, c] -= h
        numeric = (multibox.conf_loss(plus, t, loss_type).sum() - multibox.conf_loss(minus, t, loss_type).sum()) / 2 / h
        assert g[r, c] == pytest.approx(numeric, abs=1e-6)


def test_count_matches_and_mining_max_negative():
    """Two positives allow 2 x neg_pos_ratio 1.5 = 3 negatives: the unmatched priors of largest loss below
    neg_overlap; the prior overlapping a box by 0.6 is no candidate."""
    class P:
        mining_type, neg_pos_ratio, neg_overlap, share_location = "MAX_NEGATIVE", 1.5, 0.5, True

        @staticmethod
        def given(key):
            return False
    matches = [{-1: numpy.array([0, -1, -1, 1, -1, -1, -1])}]
    overlaps = [{-1: numpy.array([0.7, 0.1, 0.6, 0.8, 0.0, 0.2, 0.3], numpy.float32)}]
    losses = numpy.array([[9, 5, 8, 9, 1, 6, 4]], numpy.float32)
    assert multibox.count_matches(matches) == 2
    negatives = multibox.mine_hard_examples(losses, matches, overlaps, None, None, None, P)
    assert negatives[0].tolist() == [1, 5, 6]
