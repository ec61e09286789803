import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob


def lrn_layer(xp=numpy, **param):
    return create_layer({"type": "LRN", "lrn": param}, dtype=numpy.float64, xp=xp)


def run(layer, x, xp=numpy):
    bottom, top = [Blob(x.shape, numpy.float64, xp)], [Blob((), numpy.float64, xp)]
    bottom[0].data[...] = xp.asarray(x)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return bottom, top


def test_across_channels_hand_computed(xp):
    # alpha / n = 1, beta = 1: scale = 1 + sum of the squares of the neighbouring channels (clipped at the ends)
    x = numpy.array([1.0, 2.0, 3.0]).reshape(1, 3, 1, 1)
    _, top = run(lrn_layer(xp=xp, local_size=3, alpha=3.0, beta=1.0, k=1.0), x, xp)
    numpy.testing.assert_allclose(to_numpy(top[0].data).ravel(), [1 / 6, 2 / 15, 3 / 14])


def test_across_channels_caffe_defaults():
    x = numpy.array([1.0, -1.0, 2.0, 0.5, 1.5, -2.0]).reshape(1, 6, 1, 1)
    _, top = run(lrn_layer(), x)
    sq = x.ravel() ** 2
    scale = [1 + 0.2 * sq[max(0, c - 2):c + 3].sum() for c in range(6)]
    numpy.testing.assert_allclose(top[0].data.ravel(), x.ravel() * numpy.power(scale, -0.75))


def test_within_channel_hand_computed(xp):
    # alpha / n^2 = 1, beta = 1 and Caffe's shift of 1 (k is ignored): zero-padded 3x3 sums of squares
    x = numpy.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    _, top = run(lrn_layer(xp=xp, local_size=3, alpha=9.0, beta=1.0, k=5.0, norm_region="WITHIN_CHANNEL"), x, xp)
    sq = x[0, 0] ** 2
    corner = 1 + sq[:2, :2].sum()
    centre = 1 + sq.sum()
    top_mid = 1 + sq[:2, :].sum()
    y = to_numpy(top[0].data)[0, 0]
    assert y[0, 0] == pytest.approx(1 / corner)
    assert y[1, 1] == pytest.approx(5 / centre)
    assert y[0, 1] == pytest.approx(2 / top_mid)


@pytest.mark.parametrize("param", [
    {},
    {"local_size": 3, "alpha": 0.5, "beta": 0.6, "k": 2.0},
    {"local_size": 7, "alpha": 2.0, "beta": 1.3, "k": 0.5},
    {"local_size": 1, "alpha": 1.0},
])
def test_across_channels_matches_torch(param):
    torch = pytest.importorskip("torch")
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((2, 6, 3, 4))
    layer = lrn_layer(**param)
    bottom, top = run(layer, x)
    top[0].diff[...] = rng.standard_normal(x.shape)
    layer.backward(top, [True], bottom)
    p = layer.layer_param.lrn
    xt = torch.tensor(x, requires_grad=True)
    y = torch.nn.functional.local_response_norm(xt, p.local_size, p.alpha, p.beta, p.k)
    (y * torch.tensor(top[0].diff)).sum().backward()
    numpy.testing.assert_allclose(top[0].data, y.detach().numpy(), rtol=1e-12)
    numpy.testing.assert_allclose(bottom[0].diff, xt.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("param", [
    {},
    {"local_size": 3, "alpha": 2.0, "beta": 1.5, "k": 2.0},
    {"norm_region": "WITHIN_CHANNEL"},
    {"norm_region": "WITHIN_CHANNEL", "local_size": 3, "alpha": 3.0, "beta": 0.5},
])
def test_gradient_check(param):
    x = numpy.random.default_rng(1).standard_normal((2, 7, 4, 3))
    assert check_gradient(lrn_layer(**param), [make_blob(x)], [Blob((), numpy.float64)]) > 0


def test_errors():
    with pytest.raises(ConfigError, match="local_size must be odd"):
        lrn_layer(local_size=4)
    with pytest.raises(ShapeError, match="4-D bottom"):
        lrn_layer().setup([Blob((2, 3))], [Blob()])
