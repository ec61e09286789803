"""Im2col: PyTorch's unfold and hand-picked columns as references, col2im's gradient, N-d and batch axes."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob

torch = pytest.importorskip("torch")
RS = numpy.random.RandomState(5)


def im2col_layer(xp=numpy, **param):
    return create_layer({"type": "Im2col", "convolution": param}, dtype=numpy.float64, xp=xp)


def forward(layer, x, xp=numpy):
    bottom, top = [make_blob(x, xp=xp)], [Blob((), numpy.float64, xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return bottom, top


def pair(v):
    return tuple(v) if isinstance(v, list) else (v, v)


@pytest.mark.parametrize("kernel,stride,pad,dilation", [(3, 1, 1, 1), (2, 2, 0, 1), ([3, 2], [2, 1], [1, 0], 2)])
@pytest.mark.parametrize("force_nd", [False, True])
def test_matches_unfold_and_col2im_is_unfolds_gradient(xp, kernel, stride, pad, dilation, force_nd):
    x = RS.randn(2, 3, 6, 7)
    layer = im2col_layer(xp, kernel_size=kernel, stride=stride, pad=pad, dilation=dilation, force_nd_im2col=force_nd)
    bottom, top = forward(layer, x, xp)
    tx = torch.tensor(x, requires_grad=True)
    cols = torch.nn.functional.unfold(tx, pair(kernel), dilation=pair(dilation), padding=pair(pad), stride=pair(stride))
    n, k = top[0].shape[:2]
    numpy.testing.assert_array_equal(to_numpy(top[0].data).reshape(n, k, -1), cols.detach().numpy())
    gy = RS.randn(*top[0].shape)
    top[0].diff[...] = xp.asarray(gy)
    layer.backward(top, [True], bottom)
    cols.backward(torch.tensor(gy.reshape(n, k, -1)))
    numpy.testing.assert_allclose(to_numpy(bottom[0].diff), tx.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_caffe_column_order_by_hand():
    # Caffe's Im2colLayer test shape: a 3x3 kernel, stride 2 on (2, 3, 6, 5) gives (2, 27, 2, 2); channel
    # (c kh + i) kw + j at output (y, x) holds x[c, 2 y + i, 2 x + j]
    x = numpy.arange(2 * 3 * 6 * 5, dtype=numpy.float64).reshape(2, 3, 6, 5)
    _, top = forward(im2col_layer(kernel_size=3, stride=2), x)
    assert top[0].shape == (2, 27, 2, 2)
    assert top[0].data[1, (2 * 3 + 1) * 3 + 2, 1, 0] == x[1, 2, 3, 2] == 167.0
    assert top[0].data[0, 0, 1, 1] == x[0, 0, 2, 2] == 12.0


@pytest.mark.parametrize("kernel,stride,pad", [(2, 1, 0), ([2, 3, 1], [1, 2, 1], [1, 0, 1])])
def test_3d_columns_by_hand_and_gradient(xp, kernel, stride, pad):
    x = RS.randn(1, 2, 3, 4, 3)
    layer = im2col_layer(xp, kernel_size=kernel, stride=stride, pad=pad)
    bottom, top = forward(layer, x, xp)
    k = kernel if isinstance(kernel, list) else [kernel] * 3
    s = stride if isinstance(stride, list) else [stride] * 3
    p = pad if isinstance(pad, list) else [pad] * 3
    out = tuple((n + 2 * pp - kk) // ss + 1 for n, kk, ss, pp in zip(x.shape[2:], k, s, p))
    assert top[0].shape == (1, 2 * k[0] * k[1] * k[2]) + out
    y = to_numpy(top[0].data)
    xpad = numpy.pad(x, [(0, 0), (0, 0)] + [(pp, pp) for pp in p])
    for c, i, j, l, a, b, d in [(1, 1, 0, 0, 1, 0, 1), (0, k[0] - 1, k[1] - 1, k[2] - 1, out[0] - 1, 0, out[2] - 1)]:
        channel = ((c * k[0] + i) * k[1] + j) * k[2] + l
        assert y[0, channel, a, b, d] == xpad[0, c, a * s[0] + i, b * s[1] + j, d * s[2] + l]
    check_gradient(im2col_layer(xp, kernel_size=kernel, stride=stride, pad=pad), [make_blob(x, xp=xp)],
                   [Blob((), numpy.float64, xp)], max_checks=40)


def test_axis_2_treats_the_leading_axes_as_batch(xp):
    x = RS.randn(2, 3, 4, 5, 6)  # axes 0 and 1 batch, 2 channels, two spatial axes
    _, top = forward(im2col_layer(xp, kernel_size=[2, 3], axis=2), x, xp)
    assert top[0].shape == (2, 3, 4 * 6, 4, 4)
    _, flat = forward(im2col_layer(kernel_size=[2, 3]), x.reshape(6, 4, 5, 6))
    numpy.testing.assert_array_equal(to_numpy(top[0].data).reshape(6, 24, 4, 4), flat[0].data)


def test_bad_geometry_is_one_config_error():
    with pytest.raises(ConfigError, match="kernel_size has 2 values for 3 spatial axes"):
        forward(im2col_layer(kernel_size=[2, 2]), RS.randn(1, 1, 3, 3, 3))


def test_no_spatial_axis_is_a_shape_error():
    """Unlike Convolution (a channel-mixing product there), Caffe's Im2col needs at least one spatial axis."""
    with pytest.raises(ShapeError, match=r"Im2col needs spatial axes after the channel axis \(axis 1\)"):
        forward(im2col_layer(kernel_size=2), RS.randn(3, 4))
