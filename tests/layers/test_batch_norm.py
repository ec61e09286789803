import numpy
import pytest

from layerforge.blob import Blob
from layerforge.errors import ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob


def _layer(block=None, phase="TRAIN", xp=numpy):
    return create_layer({"type": "BatchNorm", "batch_norm": block or {}}, phase=phase, dtype=numpy.float64, xp=xp)


def _host(a):
    return a if isinstance(a, numpy.ndarray) else a.get()


def _reference(x, eps=1e-5):
    axes = (0,) + tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return (x - mean) / numpy.sqrt(var + eps)


def test_hand_computed_values(xp):
    # channel 0 holds 1, 3 (mean 2, var 1, std sqrt(3.25)); channel 1 holds 2, 6 (mean 4, var 4, std 2.5)
    x = numpy.array([[1.0, 2.0], [3.0, 6.0]])
    layer = _layer({"eps": 2.25}, xp=xp)
    bottom, top = Blob(x.shape, numpy.float64, xp), Blob((), numpy.float64, xp)
    bottom.data[...] = xp.asarray(x)
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    numpy.testing.assert_allclose(_host(top.data), [[-1 / 3.25 ** 0.5, -2 / 2.5], [1 / 3.25 ** 0.5, 2 / 2.5]],
                               rtol=1e-15)
    # running stats: f * 0 + mean, f * 0 + m / (m - 1) * var with m = 2, factor f * 0 + 1
    numpy.testing.assert_array_equal(_host(layer.blobs[0].data), [2.0, 4.0])
    numpy.testing.assert_array_equal(_host(layer.blobs[1].data), [2.0, 8.0])
    numpy.testing.assert_array_equal(_host(layer.blobs[2].data), [1.0])


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4), (3, 2, 3, 4), (5,)])
def test_batch_statistics_forward(xp, shape):
    x = numpy.random.default_rng(0).standard_normal(shape) * 3 + 1
    layer = _layer(xp=xp)
    bottom, top = Blob(shape, numpy.float64, xp), Blob((), numpy.float64, xp)
    bottom.data[...] = xp.asarray(x)
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    xr = x.reshape(shape[0], -1) if len(shape) == 1 else x
    numpy.testing.assert_allclose(_host(top.data), _reference(xr).reshape(shape), rtol=1e-10, atol=1e-12)


def test_running_statistics_update_and_test_phase():
    g = numpy.random.default_rng(1)
    x1, x2 = g.standard_normal((4, 2, 3)), g.standard_normal((4, 2, 3)) + 2
    f = 0.9
    layer = _layer({"moving_average_fraction": f})
    bottom, top = make_blob(x1), Blob((), numpy.float64)
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    bottom.data[...] = x2
    layer.forward([bottom], [top])
    m = 4 * 3
    mean = lambda x: x.mean(axis=(0, 2))  # noqa: E731
    var = lambda x: x.var(axis=(0, 2)) * m / (m - 1)  # noqa: E731
    numpy.testing.assert_allclose(layer.blobs[0].data, f * mean(x1) + mean(x2), rtol=1e-12)
    numpy.testing.assert_allclose(layer.blobs[1].data, f * var(x1) + var(x2), rtol=1e-12)
    numpy.testing.assert_allclose(layer.blobs[2].data, [f + 1], rtol=1e-12)
    assert layer.learnable is False
    # TEST uses blob / scale_factor and leaves the blobs alone
    test_layer = _layer({"eps": 1e-3}, phase="TEST")
    test_top = Blob((), numpy.float64)
    test_layer.setup([bottom], [test_top])
    for mine, theirs in zip(test_layer.blobs, layer.blobs):
        mine.data[...] = theirs.data
    x3 = g.standard_normal((4, 2, 3))
    bottom.data[...] = x3
    test_layer.forward([bottom], [test_top])
    mu = layer.blobs[0].data / (f + 1)
    sigma2 = layer.blobs[1].data / (f + 1)
    expected = (x3 - mu[None, :, None]) / numpy.sqrt(sigma2[None, :, None] + 1e-3)
    numpy.testing.assert_allclose(test_top.data, expected, rtol=1e-12)
    numpy.testing.assert_allclose(test_layer.blobs[2].data, [f + 1], rtol=1e-12)


def test_global_stats_with_zero_scale_factor_use_zero_statistics():
    layer = _layer({"use_global_stats": True, "eps": 0.25})
    bottom, top = make_blob(numpy.array([[1.0, -2.0]])), Blob((), numpy.float64)
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    numpy.testing.assert_array_equal(top.data, [[2.0, -4.0]])


def test_train_phase_can_use_global_stats_and_test_phase_batch_stats():
    assert _layer({"use_global_stats": True}, phase="TRAIN").layer_param.batch_norm.use_global_stats
    layer = _layer({"use_global_stats": False}, phase="TEST")
    x = numpy.random.default_rng(2).standard_normal((3, 2))
    bottom, top = make_blob(x), Blob((), numpy.float64)
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    numpy.testing.assert_allclose(top.data, _reference(x), rtol=1e-10)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2, 2)])
def test_gradient_batch_statistics(shape):
    x = make_blob(numpy.random.default_rng(3).standard_normal(shape))
    assert check_gradient(_layer(), [x], [Blob((), numpy.float64)], check_params=False) == x.count


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2, 2)])
def test_gradient_global_statistics(shape):
    g = numpy.random.default_rng(4)
    layer = _layer({"use_global_stats": True})
    x, top = make_blob(g.standard_normal(shape)), Blob((), numpy.float64)
    layer.setup([x], [top])
    layer.blobs[0].data[...] = g.standard_normal(shape[1])
    layer.blobs[1].data[...] = g.uniform(0.5, 2.0, shape[1])
    layer.blobs[2].data[...] = 1.5
    # blobs are statistics, not weights: no gradient is defined for them
    assert check_gradient(layer, [x], [top], check_params=False) == x.count
    top.diff[...] = 1.0
    layer.backward([top], [True], [x])
    std = numpy.sqrt(layer.blobs[1].data / 1.5 + 1e-5)
    numpy.testing.assert_allclose(x.diff, numpy.broadcast_to((1 / std).reshape((1, -1) + (1,) * (len(shape) - 2)),
                                                             shape), rtol=1e-12)


def test_matches_torch_training_mode():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    g = numpy.random.default_rng(5)
    x, gy = g.standard_normal((4, 3, 5, 2)), g.standard_normal((4, 3, 5, 2))
    layer = _layer()
    bottom, top = make_blob(x), Blob((), numpy.float64)
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    top.diff[...] = gy
    layer.backward([top], [True], [bottom])
    tx = torch.tensor(x, requires_grad=True)
    running_mean, running_var = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    ty = F.batch_norm(tx, running_mean, running_var, training=True, momentum=1.0, eps=1e-5)
    ty.backward(torch.from_numpy(gy))
    numpy.testing.assert_allclose(top.data, ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    numpy.testing.assert_allclose(bottom.diff, tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    # momentum 1 leaves torch's running stats as the batch's (unbiased) stats: Caffe's first update
    numpy.testing.assert_allclose(layer.blobs[0].data, running_mean.numpy(), rtol=1e-12)
    numpy.testing.assert_allclose(layer.blobs[1].data, running_var.numpy(), rtol=1e-12)


@pytest.mark.parametrize("global_stats", [False, True])
def test_in_place(global_stats):
    g = numpy.random.default_rng(6)
    x, gy = g.standard_normal((3, 2, 4)), g.standard_normal((3, 2, 4))
    results = []
    for in_place in (False, True):
        layer = create_layer({"type": "BatchNorm", "bottom": ["x"], "top": ["x" if in_place else "y"],
                              "batch_norm": {"use_global_stats": global_stats}}, dtype=numpy.float64)
        bottom = make_blob(x)
        top = bottom if in_place else Blob((), numpy.float64)
        layer.setup([bottom], [top])
        layer.blobs[1].data[...] = 2.0
        layer.blobs[2].data[...] = 1.0
        layer.forward([bottom], [top])
        y = top.data.copy()
        top.data[...] = 0  # a later in-place layer clobbering the top
        top.diff[...] = gy
        layer.backward([top], [True], [bottom])
        results.append((y, bottom.diff.copy()))
    numpy.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-14)
    numpy.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-14)


def test_channel_mismatch():
    layer = _layer()
    layer.setup([make_blob(numpy.zeros((2, 3, 4)))], [Blob((), numpy.float64)])
    with pytest.raises(ShapeError, match=r"bottom shape \(2, 5, 4\) has 5 channels on axis 1, but the layer was set up "
                                         r"for 3"):
        layer.reshape([make_blob(numpy.zeros((2, 5, 4)))], [Blob((), numpy.float64)])
