"""Normalize (SSD's fork): the fork's test_normalize_layer.cpp cases, its backward (normalize_layer.cpp) by default,
and the true gradient with unequal channel scales under ``exact_gradient``."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob


def normalize(block, xp=numpy, dtype=numpy.float64):
    return create_layer({"type": "Normalize", "bottom": "x", "top": "y", "norm": block}, dtype=dtype, xp=xp)


def forward(block, x, xp=numpy):
    layer, bottom, top = normalize(block, xp), make_blob(x, xp=xp), Blob((), numpy.float64, xp)
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    return layer, to_numpy(top.data)


CONSTANT_10 = {"scale_filler": {"type": "constant", "value": 10}}


@pytest.mark.parametrize("block, norm", [
    ({}, 1), (CONSTANT_10, 10), (dict(CONSTANT_10, channel_shared=False), 10),           # across_spatial
    ({"across_spatial": False}, 1), (dict(CONSTANT_10, across_spatial=False), 10),
    (dict(CONSTANT_10, across_spatial=False, channel_shared=False), 10),
])
def test_the_forks_forward_cases(xp, block, norm):
    # the fork's bottom: (2, 3, 2, 3) of ones; each image (across_spatial) or each position has norm `norm`
    layer, y = forward(block, numpy.ones((2, 3, 2, 3)), xp)
    axes = (1, 2, 3) if block.get("across_spatial", True) else (1,)
    numpy.testing.assert_allclose(numpy.sqrt((y ** 2).sum(axis=axes)), norm, atol=1e-5)
    assert layer.blobs[0].shape == (() if block.get("channel_shared", True) else (3,))


def test_values_by_hand(xp):
    x = numpy.arange(1.0, 13.0).reshape(1, 3, 2, 2)
    block = {"across_spatial": False, "channel_shared": False, "eps": 0.0}
    layer, bottom, top = normalize(block, xp), make_blob(x, xp=xp), Blob((), numpy.float64, xp)
    layer.setup([bottom], [top])
    layer.blobs[0].data[...] = xp.asarray([1.0, 2.0, 3.0])
    layer.forward([bottom], [top])
    expected = x / numpy.sqrt((x ** 2).sum(axis=1, keepdims=True)) * numpy.array([1, 2, 3.0])[None, :, None, None]
    numpy.testing.assert_allclose(to_numpy(top.data), expected, rtol=1e-12)
    _, shared = forward({"eps": 0.0}, x, xp)
    numpy.testing.assert_allclose(shared, x / numpy.sqrt((x ** 2).sum()), rtol=1e-12)


@pytest.mark.parametrize("across_spatial", [True, False])
@pytest.mark.parametrize("channel_shared", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 2, 3), (3, 4)])
def test_gradient(across_spatial, channel_shared, shape):
    # gaussian scales: unequal per channel, where the fork's own backward is off (docstring)
    layer = normalize({"across_spatial": across_spatial, "channel_shared": channel_shared,
                       "scale_filler": {"type": "gaussian", "mean": 3.0}, "exact_gradient": True})
    x = make_blob(numpy.random.default_rng(1).standard_normal(shape))
    assert check_gradient(layer, [x], [Blob((), numpy.float64)]) > 0


def test_the_forks_gradient_cases_with_constant_scales():
    # test_normalize_layer.cpp: a bottom of ones, scale 3
    for block in ({"scale_filler": {"type": "constant", "value": 3}},
                  {"across_spatial": False, "channel_shared": False, "scale_filler": {"type": "constant", "value": 3}}):
        assert check_gradient(normalize(block), [make_blob(numpy.ones((2, 3, 2, 3)))], [Blob((), numpy.float64)],
                              stepsize=1e-2) > 0


def test_matches_torch_normalize():
    torch = pytest.importorskip("torch")
    x = numpy.random.default_rng(2).standard_normal((2, 4, 3, 3))
    layer, y = forward({"across_spatial": False, "eps": 0.0}, x)
    numpy.testing.assert_allclose(y, torch.nn.functional.normalize(torch.tensor(x), dim=1).numpy(), rtol=1e-10)


def test_a_one_axis_bottom_is_an_error():
    from layerforge.errors import ShapeError
    with pytest.raises(ShapeError, match="2 or more axes"):
        forward({}, numpy.ones(3))


def the_forks_backward(x, gy, s, across_spatial, eps):
    """normalize_layer.cpp's Backward_cpu for the bottom, step by step, per image: x, gy (N, C, S), s () or (C,)."""
    gx = numpy.empty_like(x)
    scale = numpy.broadcast_to(numpy.reshape(s, (-1, 1)), x.shape[1:])
    for n in range(len(x)):
        if across_spatial:
            norm = numpy.sqrt((x[n] ** 2).sum() + eps)
            a = (x[n] * gy[n]).sum()                                   # caffe_cpu_dot(bottom_data, top_diff)
            diff = x[n] * (a / norm / norm)                            # caffe_cpu_scale
            diff = gy[n] - diff                                        # caffe_sub
            diff = diff * (1.0 / norm)                                 # caffe_scal
        else:
            norm = numpy.sqrt(eps + (x[n] ** 2).sum(axis=0))          # per position (S,)
            a = (x[n] * gy[n]).sum(axis=0)                             # gemv over the channels: buffer_spatial
            diff = x[n] * a                                            # caffe_mul(bottom_data, a broadcast)
            diff = diff / norm ** 2                                    # caffe_div by norm^2 broadcast
            diff = gy[n] - diff                                        # caffe_sub
            diff = diff / norm                                         # caffe_div by norm broadcast
        gx[n] = diff * scale                                           # scale the diff
    return gx


@pytest.mark.parametrize("across_spatial", [True, False])
@pytest.mark.parametrize("channel_shared", [True, False])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_the_forks_bottom_gradient_by_default(xp, across_spatial, channel_shared, dtype):
    r = numpy.random.default_rng(4)
    x, gy = r.standard_normal((2, 3, 2, 3)), r.standard_normal((2, 3, 2, 3))
    block = {"across_spatial": across_spatial, "channel_shared": channel_shared, "eps": 1e-3}
    layer, bottom, top = normalize(block, xp, dtype), make_blob(x, dtype, xp), Blob((), dtype, xp)
    layer.setup([bottom], [top])
    s = numpy.array(2.5) if channel_shared else numpy.array([0.5, 2.0, 7.0])
    layer.blobs[0].data[...] = xp.asarray(s)
    layer.forward([bottom], [top])
    top.diff[...] = xp.asarray(gy)
    layer.backward([top], [True], [bottom])
    expected = the_forks_backward(x.reshape(2, 3, 6), gy.reshape(2, 3, 6), s, across_spatial, 1e-3).reshape(x.shape)
    rtol = 1e-5 if dtype == numpy.float32 else 1e-12
    numpy.testing.assert_allclose(to_numpy(bottom.diff), expected, rtol=rtol, atol=rtol)
    exact = normalize(dict(block, exact_gradient=True), xp, dtype)
    b2, t2 = make_blob(x, dtype, xp), Blob((), dtype, xp)
    exact.setup([b2], [t2])
    exact.blobs[0].data[...] = xp.asarray(s)
    exact.forward([b2], [t2])
    t2.diff[...] = xp.asarray(gy)
    exact.backward([t2], [True], [b2])
    differ = numpy.abs(to_numpy(b2.diff) - expected).max() > 1e-2
    assert differ == (not channel_shared)  # one scale: the fork's gradient is the true one


@pytest.mark.parametrize("across_spatial", [True, False])
def test_exact_gradient_by_finite_differences(xp, across_spatial):
    layer = normalize({"across_spatial": across_spatial, "channel_shared": False, "exact_gradient": True,
                       "scale_filler": {"type": "gaussian", "mean": 3.0}}, xp)
    x = make_blob(numpy.random.default_rng(5).standard_normal((2, 3, 2, 3)), xp=xp)
    assert check_gradient(layer, [x], [Blob((), numpy.float64, xp)]) > 0


def test_exact_gradient_is_a_declared_key():
    from layerforge.errors import ConfigError
    with pytest.raises(ConfigError, match="exact_gradiant"):
        normalize({"exact_gradiant": True})
