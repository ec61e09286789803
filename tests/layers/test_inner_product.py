import numpy
import pytest

from layerforge.blob import Blob
from layerforge.errors import ConfigError, ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob

GAUSS = {"type": "GAUSSIAN"}


def ip_layer(dtype=numpy.float64, **param):
    param.setdefault("weight_filler", GAUSS)
    param.setdefault("bias_filler", GAUSS)
    return create_layer({"type": "InnerProduct", "inner_product": param}, dtype=dtype)


def test_hand_computed():
    layer = ip_layer(num_output=2, weight_filler={"type": "CONSTANT", "value": 1.0},
                     bias_filler={"type": "CONSTANT", "value": 0.5})
    bottom, top = [make_blob(numpy.arange(8.0).reshape(2, 2, 2))], [Blob((), numpy.float64)]
    layer.setup(bottom, top)
    layer.blobs[0].data[1] *= 2
    layer.forward(bottom, top)
    numpy.testing.assert_array_equal(top[0].data, [[6.5, 12.5], [22.5, 44.5]])
    top[0].diff[...] = [[1, 0], [0, 1]]
    layer.backward(top, [True], bottom)
    numpy.testing.assert_array_equal(bottom[0].diff.reshape(2, 4), [[1, 1, 1, 1], [2, 2, 2, 2]])
    numpy.testing.assert_array_equal(layer.blobs[0].diff, [[0, 1, 2, 3], [4, 5, 6, 7]])
    numpy.testing.assert_array_equal(layer.blobs[1].diff, [1, 1])
    layer.backward(top, [False], bottom)
    numpy.testing.assert_array_equal(layer.blobs[1].diff, [2, 2])


@pytest.mark.parametrize("shape, axis, top_shape", [
    ((4, 3, 2, 2), 1, (4, 5)),
    ((4, 3, 2, 2), 2, (4, 3, 5)),
    ((4, 3, 2, 2), -1, (4, 3, 2, 5)),
    ((6, 7), 1, (6, 5)),
    ((3, 4, 2), 0, (5,)),
])
@pytest.mark.parametrize("transpose", [False, True])
def test_matches_torch_linear(shape, axis, top_shape, transpose):
    torch = pytest.importorskip("torch")
    layer = ip_layer(num_output=5, axis=axis, transpose=transpose)
    rng = numpy.random.default_rng(0)
    bottom, top = [make_blob(rng.standard_normal(shape))], [Blob((), numpy.float64)]
    layer.setup(bottom, top)
    assert top[0].shape == top_shape
    k = bottom[0].count // int(numpy.prod(shape[:axis % len(shape)]))
    assert layer.blobs[0].shape == ((k, 5) if transpose else (5, k))
    layer.forward(bottom, top)
    top[0].diff[...] = rng.standard_normal(top_shape)
    layer.backward(top, [True], bottom)
    x = torch.tensor(bottom[0].data, requires_grad=True)
    W = torch.tensor(layer.blobs[0].data, requires_grad=True)
    b = torch.tensor(layer.blobs[1].data, requires_grad=True)
    flat = x.reshape(-1, k) if axis % len(shape) else x.reshape(1, k)
    y = torch.nn.functional.linear(flat, W.T if transpose else W, b).reshape(top_shape)
    (y * torch.tensor(top[0].diff)).sum().backward()
    numpy.testing.assert_allclose(top[0].data, y.detach().numpy(), rtol=1e-12)
    numpy.testing.assert_allclose(bottom[0].diff, x.grad.numpy(), rtol=1e-12)
    numpy.testing.assert_allclose(layer.blobs[0].diff, W.grad.numpy(), rtol=1e-12)
    numpy.testing.assert_allclose(layer.blobs[1].diff, b.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("param", [{}, {"transpose": True}, {"bias_term": False, "axis": 2}])
def test_gradient_check(param):
    layer = ip_layer(num_output=3, **param)
    bottom = [make_blob(numpy.random.default_rng(1).standard_normal((2, 3, 2, 2)))]
    assert check_gradient(layer, bottom, [Blob((), numpy.float64)]) > 0


def test_float32_and_multiply_adds():
    layer = ip_layer(dtype=numpy.float32, num_output=10)
    bottom, top = [make_blob(numpy.ones((8, 3, 4, 4)), numpy.float32)], [Blob()]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[0].data.dtype == numpy.float32 and top[0].shape == (8, 10)
    assert layer.multiply_adds(bottom, top) == 8 * 48 * 10


def test_errors():
    with pytest.raises(ConfigError, match="num_output"):
        create_layer({"type": "InnerProduct", "inner_product": {}})
    layer = ip_layer(num_output=2)
    layer.setup([Blob((2, 3, 4))], [Blob()])
    with pytest.raises(ShapeError, match=r"bottom shape \(2, 5, 4\).*expect 12"):
        layer.reshape([Blob((2, 5, 4))], [Blob()])
    with pytest.raises(ShapeError, match="axis 3 is out of range"):
        ip_layer(num_output=2, axis=3).setup([Blob((2, 3, 4))], [Blob()])
