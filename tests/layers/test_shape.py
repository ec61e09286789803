import numpy
import pytest

from layerforge.blob import Blob
from layerforge.errors import ConfigError, ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob


def _run(definition, x, xp=numpy):
    layer = create_layer(definition, dtype=numpy.float64, xp=xp)
    bottom, top = Blob(x.shape, numpy.float64, xp), Blob((), numpy.float64, xp)
    bottom.data[...] = xp.asarray(x)
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    return layer, bottom, top


@pytest.mark.parametrize("shape, block, expected", [
    ((2, 3, 4, 5), {}, (2, 60)),
    ((2, 3, 4, 5), {"axis": 2}, (2, 3, 20)),
    ((2, 3, 4, 5), {"axis": 1, "end_axis": 2}, (2, 12, 5)),
    ((2, 3, 4, 5), {"axis": -2, "end_axis": -1}, (2, 3, 20)),
    ((2, 3, 4, 5), {"axis": 0, "end_axis": 0}, (2, 3, 4, 5)),
    ((6,), {"axis": 0}, (6,)),
])
def test_flatten(xp, shape, block, expected):
    x = numpy.arange(numpy.prod(shape), dtype=numpy.float64).reshape(shape)
    layer, bottom, top = _run({"type": "Flatten", "flatten": block}, x, xp)
    assert top.shape == expected
    numpy.testing.assert_array_equal(xp.asnumpy(top.data) if xp is not numpy else top.data, x.reshape(expected))
    top.diff[...] = xp.asarray(numpy.arange(top.data.size, dtype=numpy.float64).reshape(expected) * 2)
    layer.backward([top], [True], [bottom])
    assert bottom.diff.shape == shape
    assert float((bottom.diff - 2 * bottom.data).max()) == 0.0


def test_flatten_matches_torch():
    torch = pytest.importorskip("torch")
    x = numpy.random.default_rng(0).standard_normal((2, 3, 4, 5))
    _, _, top = _run({"type": "Flatten", "flatten": {"axis": 1, "end_axis": 2}}, x)
    numpy.testing.assert_array_equal(top.data, torch.flatten(torch.from_numpy(x), 1, 2).numpy())


def test_flatten_gradient():
    layer = create_layer({"type": "Flatten"}, dtype=numpy.float64)
    x = make_blob(numpy.random.default_rng(1).standard_normal((2, 3, 2)))
    assert check_gradient(layer, [x], [Blob((), numpy.float64)]) == 12


def test_flatten_errors():
    with pytest.raises(ShapeError, match="end_axis 1 comes before axis 2"):
        _run({"type": "Flatten", "flatten": {"axis": 2, "end_axis": 1}}, numpy.zeros((2, 3, 4)))
    with pytest.raises(ShapeError, match="axis 3 is out of range"):
        _run({"type": "Flatten", "flatten": {"axis": 3}}, numpy.zeros((2, 3, 4)))
    with pytest.raises(ConfigError, match="in place"):
        create_layer({"type": "Flatten", "bottom": ["x"], "top": ["x"]})


@pytest.mark.parametrize("shape, block, expected", [
    ((2, 3, 4, 5), {"shape": [0, -1]}, (2, 60)),
    ((2, 3, 4, 5), {"shape": [0, 0, -1]}, (2, 3, 20)),
    ((2, 3, 4, 5), {"shape": [-1, 5]}, (24, 5)),
    ((2, 3, 4, 5), {"shape": [6, 20]}, (6, 20)),
    ((2, 3, 4, 5), {"shape": [1, 3], "axis": 1, "num_axes": 1}, (2, 1, 3, 4, 5)),
    ((2, 3, 4, 5), {"shape": [1], "axis": -1, "num_axes": 0}, (2, 3, 4, 5, 1)),
    ((2, 3, 4, 5), {"shape": [-1], "axis": 1, "num_axes": 2}, (2, 12, 5)),
    ((2, 3, 4, 5), {"shape": [0, -1], "axis": 2}, (2, 3, 4, 5)),
    ((2, 1, 4), {"shape": [], "axis": 1, "num_axes": 1}, (2, 4)),
    ((6,), {"shape": [2, 1, -1]}, (2, 1, 3)),
])
def test_reshape(xp, shape, block, expected):
    x = numpy.arange(numpy.prod(shape), dtype=numpy.float64).reshape(shape)
    layer, bottom, top = _run({"type": "Reshape", "reshape": block}, x, xp)
    assert top.shape == expected
    got = top.data if xp is numpy else xp.asnumpy(top.data)
    numpy.testing.assert_array_equal(got, x.reshape(expected))
    top.diff[...] = top.data
    layer.backward([top], [True], [bottom])
    assert bottom.diff.shape == shape and bool((bottom.diff == bottom.data).all())


def test_reshape_matches_torch_and_follows_bottom_batch():
    torch = pytest.importorskip("torch")
    x = numpy.random.default_rng(0).standard_normal((4, 2, 3))
    layer, bottom, top = _run({"type": "Reshape", "reshape": {"shape": [0, -1]}}, x)
    numpy.testing.assert_array_equal(top.data, torch.from_numpy(x).reshape(4, -1).numpy())
    bottom.reshape(7, 2, 3)  # a new batch size: 0 copies it
    layer.reshape([bottom], [top])
    assert top.shape == (7, 6)


def test_reshape_gradient():
    layer = create_layer({"type": "Reshape", "reshape": {"shape": [-1, 2]}}, dtype=numpy.float64)
    x = make_blob(numpy.random.default_rng(1).standard_normal((2, 3, 2)))
    assert check_gradient(layer, [x], [Blob((), numpy.float64)]) == 12


@pytest.mark.parametrize("block, error, message", [
    ({"shape": [5, 5]}, ShapeError, r"top shape \(5, 5\) with 25 elements, but bottom shape \(2, 3, 4\) has 24"),
    ({"shape": [5, -1]}, ShapeError, "not a multiple of 5"),
    ({"shape": [0, 0, 0, 0]}, ShapeError, "no axis 3"),
    ({"shape": [2], "axis": 2, "num_axes": 2}, ShapeError, "exceeds the 3 axes"),
    ({"shape": [2], "axis": 5}, ShapeError, "out of range"),
    ({"shape": [-1, -1]}, ConfigError, "at most one dimension may be -1"),
    ({"shape": [-2]}, ConfigError, ">= -1"),
])
def test_reshape_errors(block, error, message):
    with pytest.raises(error, match=message):
        _run({"type": "Reshape", "reshape": block}, numpy.zeros((2, 3, 4)))


def test_reshape_accepts_caffe_dim_mapping():
    layer = create_layer({"type": "Reshape", "reshape": {"shape": {"dim": [0, -1]}}})
    bottom, top = Blob((2, 3, 4)), Blob()
    layer.setup([bottom], [top])
    assert top.shape == (2, 12)
