import numpy
import pytest

from layerforge import rng
from layerforge.blob import Blob
from layerforge.errors import ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob, run_layer

SHAPES = [(2, 3), (2, 3, 4), (2, 3, 2, 3)]
X = [[-2.0, -0.5, 0.0, 0.5, 3.0]]


def run(layer, x, gy, xp=numpy, in_place=False):
    """Forward and backward once; returns y, gx and the parameter diffs as numpy arrays."""
    return run_layer(layer, x, gy, xp, in_place)


def make(type_, xp=numpy, **block):
    blocks = {"ReLU": "relu", "ELU": "elu", "PReLU": "prelu"}
    d = {"type": type_}
    if block:
        d[blocks[type_]] = block
    return create_layer(d, dtype=numpy.float64, xp=xp)


@pytest.mark.parametrize("slope,expect_y,expect_g", [
    (0.0, [0, 0, 0, 0.5, 3], [0, 0, 0, 1, 1]),
    (0.1, [-0.2, -0.05, 0, 0.5, 3], [0.1, 0.1, 0.1, 1, 1]),
    (-0.5, [1.0, 0.25, 0, 0.5, 3], [-0.5, -0.5, -0.5, 1, 1]),
])
@pytest.mark.parametrize("in_place", [False, True])
def test_relu_values(xp, slope, expect_y, expect_g, in_place):
    y, gx, _ = run(make("ReLU", xp, negative_slope=slope), X, numpy.ones((1, 5)), xp, in_place)
    numpy.testing.assert_allclose(y, [expect_y])
    numpy.testing.assert_allclose(gx, [expect_g])


def test_sigmoid_tanh_elu_values(xp):
    x = numpy.array([[-1.0, 0.0, 2.0]])
    gy = numpy.array([[1.0, 2.0, 3.0]])
    s = 1 / (1 + numpy.exp(-x))
    y, gx, _ = run(make("Sigmoid", xp), x, gy, xp)
    numpy.testing.assert_allclose(y, [[0.2689414213699951, 0.5, 0.8807970779778823]], rtol=1e-12)
    numpy.testing.assert_allclose(gx, gy * s * (1 - s), rtol=1e-12)
    y, gx, _ = run(make("TanH", xp), x, gy, xp)
    numpy.testing.assert_allclose(y, [[-0.7615941559557649, 0.0, 0.9640275800758169]], rtol=1e-12)
    numpy.testing.assert_allclose(gx, gy * (1 - numpy.tanh(x) ** 2), rtol=1e-12)
    # alpha 2: y(-1) = 2 (e^-1 - 1); dy/dx(-1) = y + alpha = 2 e^-1; dy/dx(0) = alpha e^0 = 2
    y, gx, _ = run(make("ELU", xp, alpha=2.0), x, gy, xp)
    numpy.testing.assert_allclose(y, [[2 * (numpy.exp(-1) - 1), 0.0, 2.0]], rtol=1e-12)
    numpy.testing.assert_allclose(gx, [[2 * numpy.exp(-1), 4.0, 3.0]], rtol=1e-12)


def test_sigmoid_extremes_are_finite():
    y, gx, _ = run(make("Sigmoid"), [[-1000.0, 1000.0]], [[1.0, 1.0]])
    numpy.testing.assert_array_equal(y, [[0.0, 1.0]])
    numpy.testing.assert_array_equal(gx, [[0.0, 0.0]])


def test_elu_large_input_does_not_overflow():
    with numpy.errstate(all="raise"):
        y, _, _ = run(make("ELU"), [[1000.0, -1000.0]], [[1.0, 1.0]])
    numpy.testing.assert_allclose(y, [[1000.0, -1.0]])


def test_prelu_values_per_channel_and_shared():
    x = numpy.array([[[-2.0, 1.0], [-1.0, -4.0]]])  # (N=1, C=2, 2)
    gy = numpy.array([[[1.0, 2.0], [3.0, 0.5]]])
    layer = make("PReLU", filler={"type": "constant", "value": 0.0})
    layer.setup([make_blob(x)], [Blob()])
    layer.blobs[0].data[...] = [0.5, 0.25]
    bottom, top = make_blob(x), Blob()
    layer.reshape([bottom], [top])
    layer.forward([bottom], [top])
    numpy.testing.assert_allclose(top.data, [[[-1.0, 1.0], [-0.25, -1.0]]])
    top.diff[...] = gy
    layer.backward([top], [True], [bottom])
    numpy.testing.assert_allclose(bottom.diff, [[[0.5, 2.0], [0.75, 0.125]]])
    # da_0 = 1 * -2; da_1 = 3 * -1 + 0.5 * -4
    numpy.testing.assert_allclose(layer.blobs[0].diff, [-2.0, -5.0])
    layer.backward([top], [False], [bottom])  # parameter diffs accumulate
    numpy.testing.assert_allclose(layer.blobs[0].diff, [-4.0, -10.0])

    y, gx, (ga,) = run(make("PReLU", channel_shared=True), x, gy)
    assert ga.shape == ()
    numpy.testing.assert_allclose(y, [[[-0.5, 1.0], [-0.25, -1.0]]])
    numpy.testing.assert_allclose(gx, [[[0.25, 2.0], [0.75, 0.125]]])
    numpy.testing.assert_allclose(ga, -2.0 - 3.0 - 2.0)


def test_prelu_default_filler_and_shape_errors():
    layer = make("PReLU")
    layer.setup([make_blob(numpy.zeros((2, 3, 4)))], [Blob()])
    numpy.testing.assert_array_equal(layer.blobs[0].data, [0.25, 0.25, 0.25])
    with pytest.raises(ShapeError, match=r"3 channel slopes .* \(2, 5, 4\)"):
        layer.reshape([make_blob(numpy.zeros((2, 5, 4)))], [Blob()])
    with pytest.raises(ShapeError, match="at least 2 axes"):
        make("PReLU").setup([make_blob(numpy.zeros(4))], [Blob()])


@pytest.mark.parametrize("type_,block", [
    ("ReLU", {}), ("ReLU", {"negative_slope": 0.3}), ("ReLU", {"negative_slope": -0.3}), ("Sigmoid", {}),
    ("TanH", {}), ("ELU", {}), ("ELU", {"alpha": 0.5}), ("PReLU", {}), ("PReLU", {"channel_shared": True}),
])
@pytest.mark.parametrize("shape", SHAPES)
def test_gradient(type_, block, shape):
    x = numpy.random.default_rng(3).standard_normal(shape)
    check_gradient(make(type_, **block), [make_blob(x)], [Blob()], kink_range=1e-2)


@pytest.mark.parametrize("type_,block", [
    ("ReLU", {}), ("ReLU", {"negative_slope": -0.3}), ("Sigmoid", {}), ("TanH", {}), ("ELU", {}),
    ("PReLU", {"filler": {"type": "uniform"}}), ("PReLU", {"channel_shared": True}),
])
def test_in_place_matches_separate_tops(xp, type_, block):
    rs = numpy.random.default_rng(5)
    x, gy = rs.standard_normal((2, 3, 4)), rs.standard_normal((2, 3, 4))
    separate = run(make(type_, xp, **block), x, gy, xp)
    rng.seed(1234)  # same filler draw for the second layer
    in_place = run(make(type_, xp, **block), x, gy, xp, in_place=True)
    for a, b in zip(separate[:2] + tuple(separate[2]), in_place[:2] + tuple(in_place[2])):
        numpy.testing.assert_allclose(a, b, rtol=1e-14)


@pytest.mark.parametrize("type_,block,reference", [
    ("ReLU", {}, lambda F, x, w: F.relu(x)),
    ("ReLU", {"negative_slope": 0.2}, lambda F, x, w: F.leaky_relu(x, 0.2)),
    ("Sigmoid", {}, lambda F, x, w: F.sigmoid(x)),
    ("TanH", {}, lambda F, x, w: F.tanh(x)),
    ("ELU", {"alpha": 1.5}, lambda F, x, w: F.elu(x, 1.5)),
    ("PReLU", {"filler": {"type": "uniform"}}, lambda F, x, w: F.prelu(x, w)),
    ("PReLU", {"channel_shared": True, "filler": {"type": "uniform"}}, lambda F, x, w: F.prelu(x, w.reshape(1))),
])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5, 5)])
def test_matches_torch(type_, block, reference, shape):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rs = numpy.random.default_rng(7)
    x, gy = rs.standard_normal(shape), rs.standard_normal(shape)
    layer = make(type_, **block)
    y, gx, param_diffs = run(layer, x, gy)
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(numpy.array(layer.blobs[0].data), requires_grad=True) if layer.blobs else None
    ty = reference(F, tx, tw)
    ty.backward(torch.tensor(gy))
    numpy.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-14)
    numpy.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-12, atol=1e-14)
    if tw is not None:
        numpy.testing.assert_allclose(param_diffs[0], tw.grad.numpy(), rtol=1e-10)


def test_float32_stays_float32():
    layer = create_layer({"type": "ELU"})
    bottom, top = make_blob([[-1.0, 1.0]], numpy.float32), Blob()
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    top.diff[...] = 1
    layer.backward([top], [True], [bottom])
    assert top.data.dtype == bottom.diff.dtype == numpy.float32
