"""SSD's box arithmetic (layerforge.kernels.bbox) on the test vectors of weiliu89/caffe's test_bbox_util.cpp
(the deploy-side tests: sizes, intersection, clipping, overlap, encoding and decoding, fast NMS), plus the
adaptive threshold, the multi-class detections and the round trips the fork's tests imply."""
import math

import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.kernels import bbox

EPS = 1e-6


def boxes(xp, *rows, dtype=numpy.float32):
    return xp.asarray(numpy.array(rows, dtype=dtype))


def near(actual, expected, eps=EPS):
    numpy.testing.assert_allclose(to_numpy(actual), numpy.asarray(expected, dtype=numpy.float64), rtol=0, atol=eps)


def test_intersect_bbox(xp):
    ref = boxes(xp, [0.2, 0.3, 0.3, 0.5])
    tests = boxes(xp, [0.1, 0.1, 0.3, 0.4], [0.1, 0.1, 0.4, 0.6], [0, 0, 0.1, 0.1])  # partial, contains, outside
    near(bbox.intersect_bbox(ref, tests), [[0.2, 0.3, 0.3, 0.4], [0.2, 0.3, 0.3, 0.5], [0, 0, 0, 0]])


def test_bbox_size(xp):
    near(bbox.bbox_size(boxes(xp, [0.2, 0.3, 0.3, 0.5], [0.2, 0.3, 0.2, 0.5], [0.2, 0.3, 0.1, 0.5])),
         [0.02, 0, 0])  # valid, a line, invalid
    near(bbox.bbox_size(boxes(xp, [2, 3, 5, 7], [2, 3, 1, 7]), normalized=False), [4 * 5, 0])


def test_clip_bbox(xp):
    inside, outside = boxes(xp, [0.2, 0.3, 0.3, 0.5]), boxes(xp, [-0.2, -0.3, 1.3, 1.5])
    near(bbox.clip_bbox(inside), [[0.2, 0.3, 0.3, 0.5]])
    near(bbox.bbox_size(bbox.clip_bbox(inside)), [0.02])
    near(bbox.clip_bbox(outside), [[0, 0, 1, 1]])
    near(bbox.bbox_size(bbox.clip_bbox(outside)), [1])
    near(bbox.clip_bbox(boxes(xp, [-3, 5, 40, 25]), height=20, width=30), [[0, 5, 30, 20]])


def test_jaccard_overlap(xp):
    ref = boxes(xp, [0.2, 0.3, 0.3, 0.5])
    tests = boxes(xp, [0.1, 0.1, 0.3, 0.4], [0.1, 0.1, 0.4, 0.6], [0, 0, 0.1, 0.1])
    near(bbox.jaccard_overlap(ref, tests), [1 / 7, 2 / 15, 0])
    near(bbox.jaccard_overlap(tests, ref), [1 / 7, 2 / 15, 0])  # symmetric
    table = bbox.jaccard_overlap(tests[:, None], tests[None])  # a broadcast table
    assert table.shape == (3, 3)
    near(xp.diagonal(table), [1, 1, 1])


def test_coverage(xp):
    a, b = boxes(xp, [0.2, 0.3, 0.3, 0.5]), boxes(xp, [0.1, 0.1, 0.3, 0.4], [0.5, 0.5, 0.6, 0.6])
    near(bbox.bbox_coverage(a, b), [0.5, 0])  # half of a lies in the first box, none in the second


PRIOR = [0.1, 0.1, 0.3, 0.3]
BOX = [0, 0.2, 0.4, 0.5]


def test_encode_bbox_corner(xp):
    prior, box, variance = boxes(xp, PRIOR), boxes(xp, BOX), boxes(xp, [0.1] * 4)
    near(bbox.encode_bbox(prior, variance, "CORNER", True, box), [[-0.1, 0.1, 0.1, 0.2]])
    near(bbox.encode_bbox(prior, variance, "CORNER", False, box), [[-1, 1, 1, 2]], 1e-5)


def test_encode_bbox_center_size(xp):
    prior, box, variance = boxes(xp, PRIOR), boxes(xp, BOX), boxes(xp, [0.1, 0.1, 0.2, 0.2])
    near(bbox.encode_bbox(prior, variance, "CENTER_SIZE", True, box), [[0, 0.75, math.log(2), math.log(1.5)]])
    near(bbox.encode_bbox(prior, variance, "CENTER_SIZE", False, box),
         [[0, 7.5, math.log(2) / 0.2, math.log(1.5) / 0.2]], 1e-5)


def test_decode_bbox_corner(xp):
    prior, offsets, variance = boxes(xp, PRIOR), boxes(xp, [-1, 1, 1, 2]), boxes(xp, [0.1] * 4)
    near(bbox.decode_bbox(prior, variance, "CORNER", False, offsets), [BOX])
    near(bbox.decode_bbox(prior, variance, "CORNER", True, offsets), [[-0.9, 1.1, 1.3, 2.3]])


def test_decode_bbox_center_size(xp):
    prior, variance = boxes(xp, PRIOR), boxes(xp, [0.1, 0.1, 0.2, 0.2])
    near(bbox.decode_bbox(prior, variance, "CENTER_SIZE", True, boxes(xp, [0, 0.75, math.log(2), math.log(1.5)])),
         [BOX])
    near(bbox.decode_bbox(prior, variance, "CENTER_SIZE", False,
                          boxes(xp, [0, 7.5, math.log(2) * 5, math.log(1.5) * 5])), [BOX])


def _priors(xp, n=4):
    return boxes(xp, *[[0.1 * i, 0.1 * i, 0.1 * i + 0.2, 0.1 * i + 0.2] for i in range(1, n + 1)])


def test_decode_bboxes_corner(xp):
    priors, variances = _priors(xp), boxes(xp, *[[0.1] * 4] * 4)
    offsets = boxes(xp, *[[-(i % 2), (i + 1) % 2, (i + 1) % 2, i % 2] for i in range(1, 5)])
    for in_target, step in ((False, 0.1), (True, 1)):
        expected = [[0.1 * i - i % 2 * step, 0.1 * i + (i + 1) % 2 * step, 0.1 * i + 0.2 + (i + 1) % 2 * step,
                     0.1 * i + 0.2 + i % 2 * step] for i in range(1, 5)]
        near(bbox.decode_bbox(priors, variances, "CORNER", in_target, offsets), expected)


def test_decode_bboxes_corner_two_classes(xp):
    # the GPU test's layout: (prior, class, 4) offsets, class j scaled by 2 - j, decoded against (prior, 1, 4)
    priors, variances = _priors(xp), boxes(xp, *[[0.1] * 4] * 4)
    offsets = xp.asarray(numpy.array([[[-(i % 2) * (2 - j), (i + 1) % 2 * (2 - j), (i + 1) % 2 * (2 - j),
                                        i % 2 * (2 - j)] for j in range(2)] for i in range(1, 5)], numpy.float32))
    decoded = bbox.decode_bbox(priors[:, None], variances[:, None], "CORNER", False, offsets)
    expected = [[[0.1 * i - i % 2 * (2 - j) * 0.1, 0.1 * i + (i + 1) % 2 * (2 - j) * 0.1,
                  0.1 * i + 0.2 + (i + 1) % 2 * (2 - j) * 0.1, 0.1 * i + 0.2 + i % 2 * (2 - j) * 0.1]
                 for j in range(2)] for i in range(1, 5)]
    near(decoded, expected)


def test_decode_bboxes_center_size(xp):
    priors, variances = _priors(xp), boxes(xp, *[[0.1, 0.1, 0.2, 0.2]] * 4)
    expected = [[0 + i * 0.1, 0.2 + i * 0.1, 0.4 + i * 0.1, 0.5 + i * 0.1] for i in range(4)]
    in_target = boxes(xp, *[[0, 0.75, math.log(2), math.log(1.5)]] * 4)
    near(bbox.decode_bbox(priors, variances, "CENTER_SIZE", True, in_target), expected, 1e-5)
    scaled = boxes(xp, *[[0, 7.5, math.log(2) * 5, math.log(1.5) * 5]] * 4)
    near(bbox.decode_bbox(priors, variances, "CENTER_SIZE", False, scaled), expected, 1e-5)


@pytest.mark.parametrize("code_type", bbox.CODE_TYPES)
@pytest.mark.parametrize("in_target", [False, True])
def test_decode_inverts_encode(xp, code_type, in_target):
    rng = numpy.random.default_rng(3)
    lo = rng.uniform(0, 0.5, (6, 2))
    priors = xp.asarray(numpy.concatenate([lo, lo + rng.uniform(0.1, 0.5, (6, 2))], axis=1))
    lo = rng.uniform(0, 0.5, (6, 2))
    truth = xp.asarray(numpy.concatenate([lo, lo + rng.uniform(0.1, 0.5, (6, 2))], axis=1))
    variances = xp.asarray(rng.uniform(0.1, 0.3, (6, 4)))
    encoded = bbox.encode_bbox(priors, variances, code_type, in_target, truth)
    near(bbox.decode_bbox(priors, variances, code_type, in_target, encoded), to_numpy(truth), 1e-12)
    near(bbox.decode_bbox(priors, variances, code_type, in_target, encoded, clip=True),
         numpy.clip(to_numpy(truth), 0, 1), 1e-12)


def test_unknown_code_type_is_an_error(xp):
    with pytest.raises(ValueError, match="unknown code type 'CENTRE'"):
        bbox.decode_bbox(boxes(xp, PRIOR), boxes(xp, [0.1] * 4), "CENTRE", False, boxes(xp, BOX))


NMS_BOXES = [[0.1, 0.1, 0.3, 0.3], [0.2, 0.1, 0.4, 0.3], [0.2, 0.0, 0.4, 0.2], [0.1, 0.2, 0.4, 0.4]]
NMS_SCORES = [0.8, 0.7, 0.4, 0.5]


def test_apply_nms_fast(xp):
    b, s = boxes(xp, *NMS_BOXES), xp.asarray(numpy.array(NMS_SCORES, numpy.float32))
    assert bbox.non_maximum_suppression(b, s, 0.3, 0.0).tolist() == [0, 3, 2]
    assert bbox.non_maximum_suppression(b, s, 0.3, 0.0, top_k=2).tolist() == [0]
    assert bbox.non_maximum_suppression(b, s, 0.2, 0.0, top_k=3).tolist() == [0]
    assert bbox.non_maximum_suppression(b, s, 0.2, 0.5).tolist() == [0]


def test_adaptive_nms_lowers_the_threshold_after_each_kept_box(xp):
    # the second box overlaps the first by 1/3, the third overlaps the second by 0.6 and the first by 0.2
    b = boxes(xp, [0.0, 0.0, 0.2, 0.2], [0.1, 0.0, 0.3, 0.2], [0.15, 0.0, 0.35, 0.2], [0.7, 0.7, 0.9, 0.9])
    s = xp.asarray(numpy.array([0.9, 0.8, 0.7, 0.6], numpy.float32))
    near(bbox.jaccard_overlap(b[1], b[2]), 0.6, 1e-6)
    assert bbox.non_maximum_suppression(b, s, 0.7).tolist() == [0, 1, 2, 3]
    # eta 0.8: 0.7 -> 0.56 after box 0, so box 1 (1/3) stays, then 0.448: box 2 (0.6 with box 1) goes
    assert bbox.non_maximum_suppression(b, s, 0.7, eta=0.8).tolist() == [0, 1, 3]
    # below 0.5 the threshold no longer shrinks: 0.45 stays 0.45 and box 1 (1/3) is kept
    assert bbox.non_maximum_suppression(b, s, 0.45, eta=0.5).tolist() == [0, 1, 3]


def test_top_scores_keeps_equal_scores_in_index_order():
    assert bbox.top_scores(numpy.array([0.2, 0.5, 0.5, 0.1, 0.5]), 0.15).tolist() == [1, 2, 4, 0]
    assert bbox.top_scores(numpy.array([0.2, 0.5, 0.5, 0.1, 0.5]), 0.15, top_k=2).tolist() == [1, 2]
    assert bbox.top_scores(numpy.array([0.2, 0.5]), 0.5).tolist() == [0][:0]  # strictly above the threshold


def test_detections_per_class_then_keep_top_k(xp):
    b = boxes(xp, *NMS_BOXES)[None]  # shared locations
    scores = xp.asarray(numpy.array([[0.9, 0.9, 0.9, 0.9],      # background
                                     NMS_SCORES,                  # class 1: NMS keeps 0, 3, 2
                                     [0.1, 0.6, 0.05, 0.75]], numpy.float32))  # class 2: keeps 3, 1 (0 below)
    rows = bbox.detections(b, scores, 0, 0.3, score_threshold=0.08)
    assert [(int(r[0]), round(float(r[1]), 2)) for r in rows] == [(1, 0.8), (1, 0.5), (1, 0.4), (2, 0.75), (2, 0.6)]
    near(rows[1, 2:], NMS_BOXES[3])
    top = bbox.detections(b, scores, 0, 0.3, score_threshold=0.08, keep_top_k=3)
    assert [(int(r[0]), round(float(r[1]), 2)) for r in top] == [(1, 0.8), (2, 0.75), (2, 0.6)]
    no_background = bbox.detections(b, scores, -1, 0.3, score_threshold=0.08)
    assert [int(r[0]) for r in no_background] == [0, 0, 0, 1, 1, 1, 2, 2]  # equal scores: index order, 1 goes
    near(no_background[:3, 2:], [NMS_BOXES[0], NMS_BOXES[2], NMS_BOXES[3]])


def test_detections_with_a_box_set_per_class(xp):
    per_class = xp.asarray(numpy.array([NMS_BOXES, [[0.5, 0.5, 0.6, 0.6]] * 4], numpy.float32))
    scores = xp.asarray(numpy.array([[0.1] * 4, [0.9, 0.8, 0.7, 0.6]], numpy.float32))
    rows = bbox.detections(per_class, scores, 0, 0.5)
    assert rows.shape == (1, 6)  # the four identical boxes of class 1 suppress each other
    near(rows[0], [1, 0.9, 0.5, 0.5, 0.6, 0.6])
