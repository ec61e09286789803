"""Permute (SSD's fork): the fork's test_permute_layer.cpp cases and the gradient."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob


def permute(order, xp=numpy):
    return create_layer({"type": "Permute", "bottom": "x", "top": "y", "permute": {"order": order}},
                        dtype=numpy.float64, xp=xp)


def forward(order, x, xp=numpy):
    layer, bottom, top = permute(order, xp), make_blob(x, xp=xp), Blob((), numpy.float64, xp)
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    return to_numpy(top.data)


@pytest.mark.parametrize("order, shape", [([0, 2, 3, 1], (2, 4, 5, 3)), ([], (2, 3, 4, 5)), ([0, 1, 2, 3], (2, 3, 4, 5)),
                                          ([0, 2], (2, 4, 3, 5)), ([3], (5, 2, 3, 4))])
def test_set_up_shapes(order, shape):
    # the fork's TestSetUp / TestSetUpIdentity on (2, 3, 4, 5), and missing axes following in order
    assert forward(order, numpy.zeros((2, 3, 4, 5))).shape == shape


def test_forward_2d(xp):
    x = numpy.tile(numpy.array([[1.0, 2, 3], [4, 5, 6]]), (2, 3, 1, 1))
    y = forward([0, 1, 3, 2], x, xp)
    assert y.reshape(-1, 6).tolist() == [[1, 4, 2, 5, 3, 6]] * 6


def test_forward_3d(xp):
    x = numpy.tile(numpy.arange(1.0, 13).reshape(1, 2, 2, 3), (2, 1, 1, 1))
    y = forward([0, 2, 3, 1], x, xp)
    assert y.reshape(2, 12).tolist() == [[1, 7, 2, 8, 3, 9, 4, 10, 5, 11, 6, 12]] * 2


def test_two_permutes_give_back_the_input(xp):
    x = numpy.random.default_rng(1701).standard_normal((2, 3, 4, 5))
    y = forward([0, 2, 3, 1], x, xp)
    assert y.shape == (2, 4, 5, 3)
    numpy.testing.assert_array_equal(forward([0, 3, 1, 2], y, xp), x)


def test_gradient():
    x = make_blob(numpy.random.default_rng(3).standard_normal((2, 2, 2, 3)))
    assert check_gradient(permute([0, 2, 3, 1]), [x], [Blob((), numpy.float64)]) == x.count


def test_bad_orders():
    with pytest.raises(ConfigError, match="names an axis twice"):
        permute([0, 2, 2])
    with pytest.raises(ShapeError, match="does not have"):
        forward([0, 4], numpy.zeros((2, 3, 4, 5)))


def test_matches_torch_permute():
    torch = pytest.importorskip("torch")
    x = numpy.random.default_rng(4).standard_normal((2, 3, 4, 5))
    gy = numpy.random.default_rng(5).standard_normal((2, 4, 5, 3))
    layer, bottom, top = permute([0, 2, 3, 1]), make_blob(x), Blob((), numpy.float64)
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    top.diff[...] = gy
    layer.backward([top], [True], [bottom])
    xt = torch.tensor(x, requires_grad=True)
    yt = xt.permute(0, 2, 3, 1)
    (yt * torch.tensor(gy)).sum().backward()
    numpy.testing.assert_array_equal(top.data, yt.detach().numpy())
    numpy.testing.assert_array_equal(bottom.diff, xt.grad.numpy())
