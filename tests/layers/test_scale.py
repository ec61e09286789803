import numpy
import pytest

from layerforge.blob import Blob
from layerforge.errors import ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob


def _host(a):
    return a if isinstance(a, numpy.ndarray) else a.get()


def _layer(block=None, n_bottom=1, xp=numpy, in_place=False):
    bottoms = ["x", "s"][:n_bottom]
    return create_layer({"type": "Scale", "bottom": bottoms, "top": ["x" if in_place else "y"], "scale": block or {}},
                        dtype=numpy.float64, xp=xp)


def test_defaults_are_identity_and_hand_values(xp):
    x = numpy.arange(12.0).reshape(2, 3, 2)
    layer = _layer({"bias_term": True, "bias_filler": {"type": "constant", "value": 0.5}}, xp=xp)
    bottom, top = Blob(x.shape, numpy.float64, xp), Blob((), numpy.float64, xp)
    bottom.data[...] = xp.asarray(x)
    layer.setup([bottom], [top])
    assert [b.shape for b in layer.blobs] == [(3,), (3,)]
    numpy.testing.assert_array_equal(_host(layer.blobs[0].data), [1, 1, 1])
    layer.blobs[0].data[...] = xp.asarray([2.0, -1.0, 0.0])
    layer.forward([bottom], [top])
    expected = x * numpy.array([2.0, -1.0, 0.0])[None, :, None] + 0.5
    numpy.testing.assert_array_equal(_host(top.data), expected)
    top.diff[...] = 1.0
    layer.backward([top], [True], [bottom])
    numpy.testing.assert_array_equal(_host(layer.blobs[0].diff), x.sum(axis=(0, 2)))
    numpy.testing.assert_array_equal(_host(layer.blobs[1].diff), [4, 4, 4])
    numpy.testing.assert_array_equal(_host(bottom.diff), numpy.broadcast_to([[[2.0], [-1.0], [0.0]]], x.shape))
    layer.backward([top], [True], [bottom])  # parameter diffs accumulate
    numpy.testing.assert_array_equal(_host(layer.blobs[1].diff), [8, 8, 8])


@pytest.mark.parametrize("shape, block, scale_shape", [
    ((2, 3, 4, 5), {}, (3,)),
    ((2, 3, 4, 5), {"axis": 1, "num_axes": 2}, (3, 4)),
    ((2, 3, 4, 5), {"axis": 2, "num_axes": -1}, (4, 5)),
    ((2, 3, 4, 5), {"axis": -1}, (5,)),
    ((2, 3, 4, 5), {"axis": 0, "num_axes": 0}, ()),
    ((2, 3), {"axis": 0, "num_axes": -1}, (2, 3)),
])
def test_learned_scale_shapes_and_gradient(shape, block, scale_shape):
    g = numpy.random.default_rng(0)
    layer = _layer(dict(block, bias_term=True, filler={"type": "gaussian"}, bias_filler={"type": "gaussian"}))
    x = make_blob(g.standard_normal(shape))
    n = check_gradient(layer, [x], [Blob((), numpy.float64)], max_checks=30)
    assert [b.shape for b in layer.blobs] == [scale_shape, scale_shape]
    assert n > 0


@pytest.mark.parametrize("shape, scale_shape, axis", [
    ((2, 3, 4), (3,), 1),
    ((2, 3, 4), (3, 4), 1),
    ((2, 3, 4), (2,), 0),
    ((2, 3, 4), (4,), -1),
    ((2, 3, 4), (), 1),
])
@pytest.mark.parametrize("bias_term", [False, True])
def test_scale_from_second_bottom(shape, scale_shape, axis, bias_term):
    g = numpy.random.default_rng(1)
    layer = _layer({"axis": axis, "bias_term": bias_term, "bias_filler": {"type": "uniform"}}, n_bottom=2)
    x, s = make_blob(g.standard_normal(shape)), make_blob(g.standard_normal(scale_shape))
    check_gradient(layer, [x, s], [Blob((), numpy.float64)])
    assert len(layer.blobs) == int(bias_term)
    a = axis % len(shape) if scale_shape else 0
    s_b = s.data.reshape(s.shape + (1,) * (len(shape) - a - len(scale_shape)))
    b_b = layer.blobs[0].data.reshape(s_b.shape) if bias_term else 0
    top = [Blob((), numpy.float64)]
    layer.reshape([x, s], top)
    layer.forward([x, s], top)
    numpy.testing.assert_allclose(top[0].data, x.data * s_b + b_b, rtol=1e-14)


def test_matches_torch():
    torch = pytest.importorskip("torch")
    g = numpy.random.default_rng(2)
    x, s, gy = g.standard_normal((2, 3, 4)), g.standard_normal(3), g.standard_normal((2, 3, 4))
    layer = _layer(n_bottom=2)
    bottom, top = [make_blob(x), make_blob(s)], [Blob((), numpy.float64)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = gy
    layer.backward(top, [True, True], bottom)
    tx, ts = torch.tensor(x, requires_grad=True), torch.tensor(s, requires_grad=True)
    ty = tx * ts.view(1, 3, 1)
    ty.backward(torch.from_numpy(gy))
    numpy.testing.assert_allclose(top[0].data, ty.detach().numpy(), rtol=1e-14)
    numpy.testing.assert_allclose(bottom[0].diff, tx.grad.numpy(), rtol=1e-14)
    numpy.testing.assert_allclose(bottom[1].diff, ts.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("n_bottom", [1, 2])
def test_in_place_keeps_input_for_scale_gradient(n_bottom):
    g = numpy.random.default_rng(3)
    x, s, gy = g.standard_normal((2, 3, 2)), g.standard_normal(3), g.standard_normal((2, 3, 2))
    results = []
    for in_place in (False, True):
        layer = _layer({"bias_term": True}, n_bottom=n_bottom, in_place=in_place)
        bottom = [make_blob(x), make_blob(s)][:n_bottom]
        top = [bottom[0] if in_place else Blob((), numpy.float64)]
        layer.setup(bottom, top)
        if n_bottom == 1:
            layer.blobs[0].data[...] = s
        layer.forward(bottom, top)
        y = top[0].data.copy()
        top[0].diff[...] = gy
        layer.backward(top, [True] * n_bottom, bottom)
        results.append([y, bottom[0].diff.copy(), (layer.blobs[0].diff if n_bottom == 1 else bottom[1].diff).copy()])
    for a, b in zip(*results):
        numpy.testing.assert_allclose(a, b, rtol=1e-14)


def test_shape_errors():
    layer = _layer(n_bottom=2)
    with pytest.raises(ShapeError, match=r"scale shape \(4,\) does not match bottom\[0\] shape \(2, 3, 4\) at axes 1"):
        layer.setup([make_blob(numpy.zeros((2, 3, 4))), make_blob(numpy.zeros(4))], [Blob()])
    with pytest.raises(ShapeError, match="exceeds the 3 axes"):
        _layer({"axis": 2, "num_axes": 2}).setup([make_blob(numpy.zeros((2, 3, 4)))], [Blob()])
    layer = _layer()
    layer.setup([make_blob(numpy.zeros((2, 3, 4)))], [Blob()])
    with pytest.raises(ShapeError, match=r"scale shape \(3,\) does not match bottom\[0\] shape \(2, 5, 4\)"):
        layer.reshape([make_blob(numpy.zeros((2, 5, 4)))], [Blob()])
