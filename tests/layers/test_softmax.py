import numpy
import pytest

from layerforge.blob import Blob
from layerforge.errors import ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob, run_layer


def softmax_layer(axis=1, xp=numpy):
    return create_layer({"type": "Softmax", "softmax": {"axis": axis}}, dtype=numpy.float64, xp=xp)


def run(layer, x, gy, xp=numpy, in_place=False):
    return run_layer(layer, x, gy, xp, in_place)[:2]


@pytest.mark.parametrize("in_place", [False, True])
def test_hand_computed(xp, in_place):
    # softmax(0, ln 2, ln 3) = (1, 2, 3) / 6; dx = y (dy - <dy, y>) with dy = e_0: <dy, y> = 1/6
    x = numpy.log([[1.0, 2.0, 3.0]])
    gy = numpy.array([[1.0, 0.0, 0.0]])
    y, gx = run(softmax_layer(xp=xp), x, gy, xp, in_place)
    numpy.testing.assert_allclose(y, [[1 / 6, 2 / 6, 3 / 6]], rtol=1e-14)
    numpy.testing.assert_allclose(gx, [[1 / 6 * 5 / 6, -2 / 36, -3 / 36]], rtol=1e-14)


def test_large_inputs_are_stable():
    y, _ = run(softmax_layer(), [[1000.0, 1000.0, -1000.0]], numpy.zeros((1, 3)))
    numpy.testing.assert_allclose(y, [[0.5, 0.5, 0.0]])


@pytest.mark.parametrize("shape,axis", [((2, 5), 1), ((2, 3, 4), 1), ((2, 3, 4), -1), ((2, 3, 2, 2), 0),
                                        ((2, 3, 2, 2), 2)])
def test_sums_to_one_and_gradient(shape, axis):
    x = numpy.random.default_rng(0).standard_normal(shape)
    y, _ = run(softmax_layer(axis), x, numpy.zeros(shape))
    numpy.testing.assert_allclose(y.sum(axis=axis), 1.0, rtol=1e-14)
    check_gradient(softmax_layer(axis), [make_blob(x)], [Blob()])


@pytest.mark.parametrize("shape,axis", [((4, 7), 1), ((2, 3, 4, 5), 1), ((2, 3, 4, 5), -1)])
def test_matches_torch(shape, axis):
    torch = pytest.importorskip("torch")
    rs = numpy.random.default_rng(1)
    x, gy = rs.standard_normal(shape) * 3, rs.standard_normal(shape)
    y, gx = run(softmax_layer(axis), x, gy)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.softmax(tx, dim=axis)
    ty.backward(torch.tensor(gy))
    numpy.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12)
    numpy.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_axis_out_of_range():
    with pytest.raises(ShapeError, match="axis 3 is out of range") as e:
        softmax_layer(3).setup([make_blob(numpy.zeros((2, 3, 4)))], [Blob()])
    assert e.value.key == "softmax.axis"
