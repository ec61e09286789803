"""BN (SegNet's and ENet's fork): the formula by hand, PyTorch's batch_norm, the batch-statistics tops, gradients."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob

GAUSS = {"type": "gaussian"}


def bn(mode, tops=1, xp=numpy, **block):
    return create_layer({"type": "BN", "bottom": "x", "top": ["y", "mean", "var"][:tops],
                         "bn": dict({"bn_mode": mode, "scale_filler": GAUSS, "shift_filler": GAUSS}, **block)},
                        dtype=numpy.float64, xp=xp)


def run(layer, x, xp=numpy, tops=1):
    bottom, top = make_blob(x, xp=xp), [Blob((), numpy.float64, xp) for _ in range(tops)]
    layer.setup([bottom], top)
    layer.forward([bottom], top)
    return bottom, top


def test_learn_by_hand_with_its_statistics_tops(xp):
    x = numpy.random.default_rng(0).standard_normal((3, 4, 5, 2)) * 3 + 1
    layer = bn("LEARN", tops=3, xp=xp)
    _, top = run(layer, x, xp, tops=3)
    s, b = (to_numpy(p.data) for p in layer.blobs)
    mean, var = x.mean(axis=(0, 2, 3), keepdims=True), x.var(axis=(0, 2, 3), keepdims=True)
    numpy.testing.assert_allclose(to_numpy(top[0].data), s * (x - mean) / numpy.sqrt(var + 1e-9) + b, rtol=1e-10)
    numpy.testing.assert_allclose(to_numpy(top[1].data), mean, rtol=1e-12)
    numpy.testing.assert_allclose(to_numpy(top[2].data), var, rtol=1e-12)
    assert layer.blobs[0].shape == (1, 4, 1, 1)


def test_inference_is_scale_and_shift(xp):
    x = numpy.random.default_rng(1).standard_normal((2, 3, 4, 4))
    layer = bn("INFERENCE", xp=xp)
    _, top = run(layer, x, xp)
    s, b = (to_numpy(p.data) for p in layer.blobs)
    numpy.testing.assert_allclose(to_numpy(top[0].data), s * x + b, rtol=1e-12)


def test_default_fillers_are_caffes_constant_zero():
    layer = create_layer({"type": "BN", "bottom": "x", "top": "y"}, dtype=numpy.float64)
    run(layer, numpy.ones((1, 2, 2, 2)))
    assert [to_numpy(p.data).tolist() for p in layer.blobs] == [[[[[0.0]], [[0.0]]]]] * 2


@pytest.mark.parametrize("mode", ["LEARN", "INFERENCE"])
def test_gradient(mode):
    x = make_blob(numpy.random.default_rng(2).standard_normal((2, 3, 3, 2)))
    assert check_gradient(bn(mode), [x], [Blob((), numpy.float64)]) == x.count + 6


@pytest.mark.parametrize("mode", ["LEARN", "INFERENCE"])
def test_matches_torch(mode):
    torch = pytest.importorskip("torch")
    x = numpy.random.default_rng(3).standard_normal((2, 3, 4, 5))
    gy = numpy.random.default_rng(4).standard_normal(x.shape)
    layer = bn(mode)
    bottom, top = run(layer, x)
    top[0].diff[...] = gy
    layer.backward(top, [True], [bottom])
    s, b = (torch.tensor(p.data.reshape(-1), requires_grad=True) for p in layer.blobs)
    xt = torch.tensor(x, requires_grad=True)
    if mode == "LEARN":
        y = torch.nn.functional.batch_norm(xt, None, None, s, b, training=True, eps=1e-9)
    else:
        y = xt * s[None, :, None, None] + b[None, :, None, None]
    (y * torch.tensor(gy)).sum().backward()
    numpy.testing.assert_allclose(top[0].data, y.detach().numpy(), rtol=1e-9, atol=1e-12)
    numpy.testing.assert_allclose(bottom.diff, xt.grad.numpy(), rtol=1e-8, atol=1e-10)
    for blob, grad in zip(layer.blobs, (s.grad, b.grad)):
        numpy.testing.assert_allclose(blob.diff.reshape(-1), grad.numpy(), rtol=1e-9)


def test_statistics_tops_need_learn_mode():
    with pytest.raises(ConfigError, match="need bn_mode LEARN"):
        bn("INFERENCE", tops=2)
