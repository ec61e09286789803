import math

import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, DataError, ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob


def to_blob(array, xp=numpy):
    array = numpy.asarray(array, dtype=numpy.float64)
    b = Blob(array.shape, numpy.float64, xp)
    b.data[...] = xp.asarray(array)
    return b


def swl(xp=numpy, axis=1, **loss):
    return create_layer({"type": "SoftmaxWithLoss", "softmax": {"axis": axis}, "loss": loss},
                        dtype=numpy.float64, xp=xp)


def run(layer, bottoms, weight=1.0, xp=numpy, n_top=1, propagate_down=None):
    """Forward and backward with top[0].diff = weight; returns the loss, the bottom diffs and the tops."""
    bottom = [to_blob(b, xp) for b in bottoms]
    top = [Blob((), numpy.float64, xp) for _ in range(n_top)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = weight
    layer.backward(top, propagate_down or [True] + [False] * (len(bottom) - 1), bottom)
    return float(top[0].data), [to_numpy(b.diff).copy() for b in bottom], top


def test_softmax_loss_hand_computed(xp):
    # p(row 0) = (1, 2, 3) / 6 with label 2; p(row 1) = (1, 1, 1) / 3 with label 0; VALID divides by 2
    x = numpy.array([[0.0, math.log(2), math.log(3)], [5.0, 5.0, 5.0]])
    loss, (gx, _), top = run(swl(xp), [x, [2, 0]], weight=3.0, xp=xp, n_top=2)
    assert top[0].shape == ()
    assert loss == pytest.approx(-(math.log(0.5) + math.log(1 / 3)) / 2, rel=1e-14)
    numpy.testing.assert_allclose(gx, 3.0 / 2 * numpy.array([[1 / 6, 2 / 6, 3 / 6 - 1], [1 / 3 - 1, 1 / 3, 1 / 3]]),
                                  rtol=1e-14)
    numpy.testing.assert_allclose(to_numpy(top[1].data), [[1 / 6, 2 / 6, 3 / 6], [1 / 3] * 3], rtol=1e-14)


def test_probability_is_clamped_at_flt_min():
    loss, (gx, _), _ = run(swl(), [[[0.0, -1000.0]], [1]])
    assert loss == pytest.approx(-math.log(numpy.finfo(numpy.float32).tiny), rel=1e-12)  # 87.3365
    numpy.testing.assert_allclose(gx, [[1.0, -1.0]])


# normalization -> the divisor of the summed loss for 2 x 3 x 2 positions with 3 ignored
@pytest.mark.parametrize("loss_block,divisor", [
    ({"normalization": "FULL"}, 12), ({"normalization": "VALID"}, 9), ({"normalization": "BATCH_SIZE"}, 2),
    ({"normalization": "NONE"}, 1), ({}, 9), ({"normalize": True}, 9), ({"normalize": False}, 2),
    ({"normalize": False, "normalization": "FULL"}, 12),
])
def test_normalization(loss_block, divisor):
    rs = numpy.random.default_rng(0)
    x = rs.standard_normal((2, 4, 3, 2))
    label = numpy.array([[0, 1], [2, 3], [7, 7], [1, 1], [7, 0], [3, 2]], dtype=float).reshape(2, 1, 3, 2)
    loss, (gx, _), _ = run(swl(ignore_label=7, **loss_block), [x, label])
    p = numpy.exp(x) / numpy.exp(x).sum(axis=1, keepdims=True)
    total, grad = 0.0, p.copy()
    for n, h, w in numpy.ndindex(2, 3, 2):
        k = int(label[n, 0, h, w])
        if k == 7:
            grad[n, :, h, w] = 0
            continue
        total -= math.log(p[n, k, h, w])
        grad[n, k, h, w] -= 1
    assert loss == pytest.approx(total / divisor, rel=1e-12)
    numpy.testing.assert_allclose(gx, grad / divisor, rtol=1e-12, atol=1e-15)


def test_all_ignored_gives_zero_loss_and_gradient():
    loss, (gx, _), _ = run(swl(ignore_label=-1), [numpy.ones((3, 4)), [-1, -1, -1]])
    assert loss == 0.0
    numpy.testing.assert_array_equal(gx, 0.0)


@pytest.mark.parametrize("reduction,normalization", [("mean", "VALID"), ("sum", "NONE"), ("batch", "BATCH_SIZE")])
@pytest.mark.parametrize("shape", [(6, 5), (3, 4, 2, 3)])
def test_matches_torch_cross_entropy(reduction, normalization, shape):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rs = numpy.random.default_rng(1)
    x = rs.standard_normal(shape) * 2
    label = rs.integers(0, shape[1], (shape[0],) + shape[2:])
    label.reshape(-1)[::4] = 2  # some positions ignored
    loss, (gx, _), _ = run(swl(ignore_label=2, normalization=normalization), [x, label], weight=0.7)
    tx = torch.tensor(x, requires_grad=True)
    kw = dict(ignore_index=2)
    tl = F.cross_entropy(tx, torch.tensor(label), reduction="mean", **kw) if reduction == "mean" else \
        F.cross_entropy(tx, torch.tensor(label), reduction="sum", **kw) / (shape[0] if reduction == "batch" else 1)
    (0.7 * tl).backward()
    assert loss == pytest.approx(tl.item(), rel=1e-12)
    numpy.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("shape,label_shape,axis,loss_block", [
    ((4, 3), (4,), 1, {}),
    ((2, 3, 2, 2), (2, 1, 2, 2), 1, {"ignore_label": 0}),
    ((2, 3, 4), (2, 3), -1, {"normalization": "FULL"}),
    ((3, 2, 2), (2, 2), 0, {"normalization": "NONE"}),
])
def test_gradient(shape, label_shape, axis, loss_block):
    rs = numpy.random.default_rng(2)
    x = rs.standard_normal(shape)
    label = rs.integers(0, shape[axis], label_shape).astype(float)
    check_gradient(swl(axis=axis, **loss_block), [make_blob(x), make_blob(label)], [Blob()], check_bottom=[0])


def test_label_out_of_range_is_a_data_error_naming_the_layer():
    with pytest.raises(DataError, match=r"layer 'softmaxwithloss' \(SoftmaxWithLoss\): label 3 at index \(1,\)"):
        run(swl(), [numpy.zeros((2, 3)), [0, 3]])
    with pytest.raises(DataError, match="label -1 at index"):
        run(swl(ignore_label=255), [numpy.zeros((2, 3)), [-1, 255]])
    run(swl(ignore_label=255), [numpy.zeros((2, 3)), [255, 1]])  # an ignored label may lie outside [0, C)


def test_label_count_mismatch_names_both_shapes():
    with pytest.raises(ShapeError, match=r"\(2, 3\).*must number 8.*\(2, 4, 2, 2\)") as e:
        swl().setup([make_blob(numpy.zeros((2, 4, 2, 2))), make_blob(numpy.zeros((2, 3)))], [Blob()])
    assert e.value.key == "bottom"


def test_label_bottom_takes_no_gradient():
    layer = swl()
    assert layer.default_loss_weight == 1.0
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    with pytest.raises(ConfigError, match="label"):
        run(layer, [numpy.zeros((2, 3)), [0, 1]], propagate_down=[True, True])


def test_float32():
    layer = create_layer({"type": "SoftmaxWithLoss"})
    bottom = [make_blob([[1.0, 2.0]], numpy.float32), make_blob([1], numpy.float32)]
    top = [Blob()]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = 1
    layer.backward(top, [True, False], bottom)
    assert top[0].data.dtype == bottom[0].diff.dtype == numpy.float32
    assert float(top[0].data) == pytest.approx(math.log(1 + math.exp(-1)), rel=1e-6)


# ---- EuclideanLoss -----------------------------------------------------------------------------

def euclidean(xp=numpy):
    return create_layer({"type": "EuclideanLoss"}, dtype=numpy.float64, xp=xp)


def test_euclidean_hand_computed(xp):
    # (a - b) = [[1, -2], [0, 3]]: sum of squares 14, N = 2 -> 14 / 4
    a, b = numpy.array([[1.0, 0.0], [2.0, 4.0]]), numpy.array([[0.0, 2.0], [2.0, 1.0]])
    loss, (ga, gb), _ = run(euclidean(xp), [a, b], weight=2.0, xp=xp, propagate_down=[True, True])
    assert loss == pytest.approx(3.5, rel=1e-15)
    numpy.testing.assert_allclose(ga, 2.0 / 2 * (a - b))
    numpy.testing.assert_allclose(gb, -2.0 / 2 * (a - b))


@pytest.mark.parametrize("shape_a,shape_b", [((4, 3), (4, 3)), ((2, 3, 2, 2), (2, 12)), ((5,), (5, 1))])
def test_euclidean_gradient_and_torch(shape_a, shape_b):
    rs = numpy.random.default_rng(3)
    a, b = rs.standard_normal(shape_a), rs.standard_normal(shape_b)
    check_gradient(euclidean(), [make_blob(a), make_blob(b)], [Blob()])
    torch = pytest.importorskip("torch")
    loss, (ga, gb), _ = run(euclidean(), [a, b], propagate_down=[True, True])
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    tl = torch.nn.functional.mse_loss(ta, tb.reshape(ta.shape), reduction="sum") / (2 * shape_a[0])
    tl.backward()
    assert loss == pytest.approx(tl.item(), rel=1e-12)
    numpy.testing.assert_allclose(ga, ta.grad.numpy(), rtol=1e-12)
    numpy.testing.assert_allclose(gb, tb.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("shape_a,shape_b", [((2, 3), (2, 4)), ((2, 6), (3, 4))])
def test_euclidean_shape_mismatch(shape_a, shape_b):
    with pytest.raises(ShapeError, match=rf"{shape_a[0]}, {shape_a[1]}\) and \({shape_b[0]}, {shape_b[1]}"):
        euclidean().setup([make_blob(numpy.zeros(shape_a)), make_blob(numpy.zeros(shape_b))], [Blob()])


# the SegNet fork's weight_by_label_freqs / class_weighting (its softmax_loss_layer.cpp)
WEIGHTS = [0.5, 2.0, 1.5, 3.0]


def test_class_weighting_matches_torch_weighted_cross_entropy(xp):
    torch = pytest.importorskip("torch")
    rs = numpy.random.default_rng(4)
    x = rs.standard_normal((2, 4, 3, 2)) * 2
    label = rs.integers(0, 4, (2, 3, 2))
    label.reshape(-1)[::5] = 9  # ignored
    layer = swl(xp, ignore_label=9, weight_by_label_freqs=True, class_weighting=WEIGHTS)
    loss, (gx, _), _ = run(layer, [x, label[:, None]], weight=0.7, xp=xp)
    tx = torch.tensor(x, requires_grad=True)
    # the fork divides the weighted sum by the number of valid positions (torch's "mean" by the weights' sum)
    tl = torch.nn.functional.cross_entropy(tx, torch.tensor(label), weight=torch.tensor(WEIGHTS, dtype=torch.float64),
                                           ignore_index=9, reduction="sum") / int((label != 9).sum())
    (0.7 * tl).backward()
    assert loss == pytest.approx(tl.item(), rel=1e-12)
    numpy.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-10, atol=1e-15)


def test_class_weighting_gradient():
    rs = numpy.random.default_rng(5)
    x, label = rs.standard_normal((2, 4, 2, 3)), rs.integers(0, 4, (2, 1, 2, 3)).astype(float)
    check_gradient(swl(weight_by_label_freqs=True, class_weighting=WEIGHTS), [make_blob(x), make_blob(label)],
                   [Blob()], check_bottom=[0])


def test_class_weighting_refusals():
    with pytest.raises(ConfigError, match="class_weighting has 4 values for 3 classes"):
        run(swl(weight_by_label_freqs=True, class_weighting=WEIGHTS), [numpy.ones((2, 3)), [0, 1]])
    with pytest.raises(ConfigError, match="class_weighting applies only with weight_by_label_freqs"):
        run(swl(class_weighting=WEIGHTS), [numpy.ones((2, 4)), [0, 1]])
