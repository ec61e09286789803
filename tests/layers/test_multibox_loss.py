"""MultiBoxLoss (the SSD fork's test_multibox_loss_layer.cpp): set-up over its options, and the gradients of the
location and confidence predictions by finite differences over the fork's option grid; hand-computed values."""
import itertools
import math

import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob

NUM, CLASSES, PRIORS = 3, 3, 16  # the fork's fixture: 3 images, 3 classes, a 2 x 2 map with 4 priors a place


def fork_priors():
    """PriorBox of the fork's fixture: a 2 x 2 map over a 20 x 20 image, min_size 5, max_size 10, aspect ratio 3
    flipped, variance 0.1: boxes (1, 2, 4 P)."""
    boxes = []
    for h, w in itertools.product(range(2), range(2)):
        cx, cy = (w + 0.5) * 10, (h + 0.5) * 10
        sides = [(5, 5), (math.sqrt(50), math.sqrt(50)), (5 * math.sqrt(3), 5 / math.sqrt(3)),
                 (5 / math.sqrt(3), 5 * math.sqrt(3))]
        boxes += [[(cx - bw / 2) / 20, (cy - bh / 2) / 20, (cx + bw / 2) / 20, (cy + bh / 2) / 20] for bw, bh in sides]
    return numpy.stack([numpy.array(boxes).reshape(-1), numpy.full(4 * PRIORS, 0.1)])[None]


# the fork's ground truth: image 0 one box of class 1; image 2 one of class 1, two of class 2 (one difficult)
GT = numpy.array([[0, 1, 0, 0.1, 0.1, 0.3, 0.3, 0], [2, 1, 0, 0.1, 0.1, 0.3, 0.3, 0],
                  [2, 2, 0, 0.2, 0.2, 0.4, 0.4, 0], [2, 2, 1, 0.6, 0.6, 0.8, 0.9, 1]])[None, None]


def bottoms(share_location, xp=numpy, seed=0):
    r = numpy.random.default_rng(seed)
    loc_classes = 1 if share_location else CLASSES
    loc = r.normal(0, 0.5, (NUM, PRIORS * loc_classes * 4))
    conf = r.normal(0, 1.0, (NUM, PRIORS * CLASSES))
    return [make_blob(a, xp=xp) for a in (loc, conf, fork_priors(), GT)]


def layer(xp=numpy, propagate_down=None, normalization="VALID", **options):
    definition = {"type": "MultiBoxLoss", "multibox_loss": dict({"num_classes": CLASSES}, **options),
                  "loss": {"normalization": normalization}, "bottom": ["loc", "conf", "prior", "label"],
                  "top": ["loss"]}
    if propagate_down is not None:
        definition["propagate_down"] = propagate_down
    return create_layer(definition, dtype=numpy.float64, xp=xp)


SETUPS = [(share, match, prior, mining) for share, match, prior, mining in itertools.product(
    (True, False), ("BIPARTITE", "PER_PREDICTION"), (True, False), ("NONE", "MAX_NEGATIVE", "HARD_EXAMPLE"))
    if share or mining == "NONE"]


@pytest.mark.parametrize("share, match, use_prior, mining", SETUPS)
def test_setup_and_forward(share, match, use_prior, mining):
    mbox = layer(share_location=share, match_type=match, use_prior_for_matching=use_prior, mining_type=mining)
    bottom, top = bottoms(share), [Blob((), numpy.float64)]
    mbox.setup(bottom, top)
    mbox.forward(bottom, top)
    assert top[0].shape == () and numpy.isfinite(float(top[0].data)) and float(top[0].data) > 0


# the fork's gradient grid (loss type x share_location x match x normalization x difficult x mining), walked so
# that every value of every option is checked, with several of each pair
def grid(loss_key, loss_types):
    options = list(itertools.product(loss_types, (True, False), ("BIPARTITE", "PER_PREDICTION"),
                                     ("BATCH_SIZE", "FULL", "VALID", "NONE"), (True, False),
                                     ("NONE", "MAX_NEGATIVE", "HARD_EXAMPLE")))
    options = [o for o in options if o[1] or o[5] == "NONE"]
    return [dict(zip((loss_key, "share", "match", "norm", "difficult", "mining"), o)) for o in options[::7]]


@pytest.mark.parametrize("case", grid("loc_loss_type", ("L2", "SMOOTH_L1")), ids=str)
def test_loc_gradient(case):
    mbox = layer(propagate_down=[True, False, False, False], normalization=case["norm"],
                 loc_loss_type=case["loc_loss_type"], share_location=case["share"], match_type=case["match"],
                 use_difficult_gt=case["difficult"], mining_type=case["mining"])
    assert check_gradient(mbox, bottoms(case["share"]), [Blob((), numpy.float64)], check_bottom=[0],
                          stepsize=1e-4, threshold=1e-4, max_checks=48) > 0


@pytest.mark.parametrize("case", grid("conf_loss_type", ("SOFTMAX", "LOGISTIC")), ids=str)
def test_conf_gradient(case):
    mbox = layer(propagate_down=[False, True, False, False], normalization=case["norm"],
                 conf_loss_type=case["conf_loss_type"], share_location=case["share"], match_type=case["match"],
                 use_difficult_gt=case["difficult"], mining_type=case["mining"], background_label_id=0)
    assert check_gradient(mbox, bottoms(case["share"]), [Blob((), numpy.float64)], check_bottom=[1],
                          stepsize=1e-4, threshold=1e-4, max_checks=48) > 0


@pytest.mark.parametrize("options", [
    {"code_type": "CENTER_SIZE", "encode_variance_in_target": True, "exact_gradient": True},
    {"code_type": "CORNER_SIZE", "bp_inside": True},
    {"use_prior_for_matching": False, "code_type": "CENTER_SIZE"},
    {"mining_type": "HARD_EXAMPLE", "nms_param": {"nms_threshold": 0.5, "top_k": 10}, "sample_size": 4},
    {"map_object_to_agnostic": True, "num_classes": 2},
])
def test_gradient_of_the_coding_options(options):
    classes = options.get("num_classes", CLASSES)
    mbox = layer(**options)
    bottom = bottoms(True)
    if classes != CLASSES:
        bottom[1] = make_blob(numpy.random.default_rng(1).normal(0, 1, (NUM, PRIORS * classes)))
    assert check_gradient(mbox, bottom, [Blob((), numpy.float64)], check_bottom=[0, 1], stepsize=1e-4,
                          threshold=1e-4, max_checks=32) > 0


def test_value_by_hand():
    """One image, one box equal to prior 0: with CORNER coding and no mining, the location loss is the smooth L1 of
    the predicted offsets of prior 0 and the confidence loss the softmax cross entropy of every prior."""
    priors = numpy.array([[[0.1, 0.1, 0.3, 0.3, 0.5, 0.5, 0.9, 0.9], [0.1] * 8]])
    gt = numpy.array([[[[0, 1, 0, 0.1, 0.1, 0.3, 0.3, 0]]]])
    loc = numpy.array([[0.05, -2.0, 3.0, 0.0, 9, 9, 9, 9]])  # the target offsets of prior 0 are 0
    conf = numpy.array([[0.0, 1.0, 2.0, 0.5]])  # 2 priors x 2 classes
    mbox = create_layer({"type": "MultiBoxLoss", "multibox_loss": {"num_classes": 2, "mining_type": "NONE"}},
                        dtype=numpy.float64)
    bottom, top = [make_blob(a) for a in (loc, conf, priors, gt)], [Blob((), numpy.float64)]
    mbox.setup(bottom, top)
    mbox.forward(bottom, top)
    smooth = 0.5 * 0.05 ** 2 + (2 - 0.5) + (3 - 0.5) + 0
    softmax = -math.log(math.exp(1) / (1 + math.exp(1))) - math.log(1 / (1 + math.exp(-1.5)))
    assert float(top[0].data) == pytest.approx(smooth + softmax)  # VALID: one match
    top[0].diff[...] = 2.0
    mbox.backward(top, [True, True, False, False], bottom)
    numpy.testing.assert_allclose(to_numpy(bottom[0].diff), [[2 * 0.05, -2, 2, 0, 0, 0, 0, 0]])
    p = 1 / (1 + numpy.exp(-numpy.array([1.0, 1.5])))  # softmax of prior 0's class 1 and of prior 1's class 0
    numpy.testing.assert_allclose(to_numpy(bottom[1].diff),
                                  [[2 * (1 - p[0]), 2 * (p[0] - 1), 2 * (p[1] - 1), 2 * (1 - p[1])]])


def variance_in_target(xp, **options):
    """One image, one box: prior 0 (variance 0.1) against a box 0.01 wider on the left, CORNER coding,
    ``encode_variance_in_target``; backward from a top diff of 2. Returns (loss, location gradient)."""
    priors = numpy.array([[[0.1, 0.1, 0.3, 0.3, 0.5, 0.5, 0.9, 0.9], [0.1] * 8]])
    gt = numpy.array([[[[0, 1, 0, 0.09, 0.1, 0.3, 0.3, 0]]]])
    loc = numpy.array([[0.05, -2.0, 3.0, 0.0, 9, 9, 9, 9]])
    conf = numpy.zeros((1, 4))
    mbox = create_layer({"type": "MultiBoxLoss", "bottom": ["loc", "conf", "prior", "label"], "top": ["loss"],
                         "propagate_down": [True, False, False, False], "multibox_loss": dict({"num_classes": 2, "mining_type": "NONE",
                                                "encode_variance_in_target": True}, **options)},
                        dtype=numpy.float64, xp=xp)
    bottom, top = [make_blob(a, xp=xp) for a in (loc, conf, priors, gt)], [Blob((), numpy.float64, xp)]
    mbox.setup(bottom, top)
    mbox.forward(bottom, top)
    top[0].diff[...] = 2.0
    mbox.backward(top, [True, False, False, False], bottom)
    return float(top[0].data), to_numpy(bottom[0].diff)


def test_encode_variance_in_target_by_hand_as_the_fork(xp):
    """EncodeLocPrediction divides prediction and target by the variance: d = (loc - (gt - prior)) / 0.1 =
    (0.6, -20, 30, 0); smooth L1 0.18 + 19.5 + 29.5. Backward_cpu copies d's gradient (0.6, -1, 1, 0) times the
    top diff back unscaled; exact_gradient adds the 1 / 0.1 of d's derivative."""
    loss, fork = variance_in_target(xp)
    assert loss == pytest.approx(0.5 * 0.6 ** 2 + 19.5 + 29.5, rel=1e-5)
    numpy.testing.assert_allclose(fork, [[2 * 0.6, -2, 2, 0, 0, 0, 0, 0]], rtol=1e-5)
    loss_exact, exact = variance_in_target(xp, exact_gradient=True)
    assert loss_exact == loss
    numpy.testing.assert_allclose(exact, 10 * fork, rtol=1e-6)


@pytest.mark.parametrize("code_type", ["CORNER", "CENTER_SIZE"])
def test_exact_gradient_by_finite_differences(xp, code_type):
    mbox = layer(xp, propagate_down=[True, False, False, False], code_type=code_type,
                 encode_variance_in_target=True, exact_gradient=True)
    assert check_gradient(mbox, bottoms(True, xp), [Blob((), numpy.float64, xp)], check_bottom=[0], stepsize=1e-4,
                          threshold=1e-4, max_checks=24) > 0


def test_the_location_term_follows_propagate_down():
    full, loc_only = layer(), layer(propagate_down=[True, False, False, False])
    values = []
    for mbox in (full, loc_only):
        bottom, top = bottoms(True), [Blob((), numpy.float64)]
        mbox.setup(bottom, top)
        mbox.forward(bottom, top)
        values.append(float(top[0].data))
    assert values[1] < values[0]


def test_cupy_agrees(xp):
    values = []
    for module in {numpy, xp}:
        mbox = layer(module)
        bottom, top = bottoms(True, module), [Blob((), numpy.float64, module)]
        mbox.setup(bottom, top)
        mbox.forward(bottom, top)
        top[0].diff[...] = 1
        mbox.backward(top, [True, True, False, False], bottom)
        values.append((float(top[0].data), to_numpy(bottom[0].diff), to_numpy(bottom[1].diff)))
    for a, b in zip(values[0], values[-1]):
        numpy.testing.assert_allclose(a, b, rtol=1e-10)


def test_bad_options_and_labels():
    with pytest.raises(ConfigError, match="mining needs share_location"):
        layer(share_location=False)
    with pytest.raises(ConfigError, match="num_classes"):
        create_layer({"type": "MultiBoxLoss"})
    mbox = layer()
    bottom, top = bottoms(True), [Blob((), numpy.float64)]
    bottom[3] = make_blob(numpy.array([[[[1, 7, 0, 0.1, 0.1, 0.3, 0.3, 0]]]]))
    mbox.setup(bottom, top)
    with pytest.raises(DataError, match="image 1 of the batch has a box of label 7, outside"):
        mbox.forward(bottom, top)


class _Halves:
    """The other replica of a batch split in two, as a batch_group: its match count is known beforehand."""

    count = 2

    def __init__(self, other):
        self.other = other

    def sum(self, values):
        return numpy.array([values[0] + self.other])


def test_two_replicas_are_one_process():
    """Images {0, 2} and {1} as two replicas (ground truth split with them): with VALID normalisation, the mean of
    their gradients is the whole batch's through batch_group, which counts the other replica's matches.
    (BATCH_SIZE and FULL divide by a count per image: equal shares, as the replicas' are, need nothing.)"""
    def run(rows, loc, conf, group=None):
        mbox = layer()
        mbox.batch_group = group
        bottom = [make_blob(loc), make_blob(conf), make_blob(fork_priors()), make_blob(rows[None, None])]
        top = [Blob((), numpy.float64)]
        mbox.setup(bottom, top)
        mbox.forward(bottom, top)
        top[0].diff[...] = 1
        mbox.backward(top, [True, True, False, False], bottom)
        return mbox.num_matches, to_numpy(bottom[0].diff), to_numpy(bottom[1].diff)

    whole = bottoms(True)
    loc, conf, gt = (to_numpy(b.data) for b in (whole[0], whole[1], whole[3]))
    gt = gt.reshape(-1, 8)
    _, g_loc, g_conf = run(gt, loc, conf)
    first = gt[gt[:, 0] != 1].copy()
    first[:, 0] = numpy.where(first[:, 0] == 2, 1, first[:, 0])
    second = gt[gt[:, 0] == 1].copy() if (gt[:, 0] == 1).any() else numpy.full((1, 8), -1.0)
    second[:, 0] = numpy.where(second[:, 0] == 1, 0, second[:, 0])
    m_first, _, _ = run(first, loc[[0, 2]], conf[[0, 2]])
    m_second, _, _ = run(second, loc[[1]], conf[[1]])
    _, loc_a, conf_a = run(first, loc[[0, 2]], conf[[0, 2]], _Halves(m_second))
    _, loc_b, conf_b = run(second, loc[[1]], conf[[1]], _Halves(m_first))
    assert m_first > 0 and m_second == 0  # image 1 has no box: the replica alone would divide by 1
    for g_whole, a, b in ((g_loc, loc_a, loc_b), (g_conf, conf_a, conf_b)):
        replicas = numpy.empty_like(g_whole)
        replicas[[0, 2]], replicas[[1]] = a, b
        numpy.testing.assert_allclose(replicas / 2, g_whole, rtol=1e-12, atol=1e-15)  # the exchange's mean
