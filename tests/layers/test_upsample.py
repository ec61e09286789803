"""Upsample (SegNet's and ENet's fork): the forks' test_upsample_layer.cpp cases, PyTorch's max_unpool2d after our
MAX Pooling's mask top, output sizes, the gradient."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ConfigError, DataError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob


def upsample(block, xp=numpy):
    return create_layer({"type": "Upsample", "bottom": ["x", "mask"], "top": "y", "upsample": block},
                        dtype=numpy.float64, xp=xp)


def run(block, x, mask, xp=numpy):
    layer, bottom, top = upsample(block, xp), [make_blob(x, xp=xp), make_blob(mask, xp=xp)], Blob((), numpy.float64, xp)
    layer.setup(bottom, [top])
    layer.forward(bottom, [top])
    return layer, bottom, top


def test_forward_square(xp):
    x = numpy.tile(numpy.array([[1.0, 2], [9, 4]]), (4, 3, 1, 1))
    mask = numpy.tile(numpy.array([[2.0, 5], [12, 14]]), (4, 3, 1, 1))
    _, _, top = run({"scale": 2}, x, mask, xp)
    assert top.shape == (4, 3, 4, 4)
    expected = [[0, 0, 1, 0], [0, 2, 0, 0], [0, 0, 0, 0], [9, 0, 4, 0]]
    assert all(plane.tolist() == expected for plane in to_numpy(top.data).reshape(-1, 4, 4))


@pytest.mark.parametrize("block, size", [({"scale_h": 2, "scale_w": 3}, (4, 6)), ({"scale": 3}, (6, 6)),
                                         ({"pad_out_h": True}, (3, 4)), ({"upsample_h": 5, "upsample_w": 7}, (5, 7))])
def test_output_sizes(block, size):
    _, _, top = run(block, numpy.ones((2, 3, 2, 2)), numpy.zeros((2, 3, 2, 2)))
    assert top.shape == (2, 3) + size


def pooled(x, shape_out=None):
    """Our MAX Pooling (2x2, stride 2) with its mask top, as SegNet's encoder has it."""
    pool = create_layer({"type": "Pooling", "bottom": "x", "top": ["p", "m"],
                         "pooling": {"pool": "MAX", "kernel_size": 2, "stride": 2}}, dtype=numpy.float64)
    bottom, top = make_blob(x), [Blob((), numpy.float64), Blob((), numpy.float64)]
    pool.setup([bottom], top)
    pool.forward([bottom], top)
    return top[0].data.copy(), top[1].data.copy()


@pytest.mark.parametrize("shape, block", [((2, 3, 4, 4), {"upsample_h": 4, "upsample_w": 4}),
                                          ((2, 3, 5, 4), {"upsample_h": 5, "upsample_w": 4}),
                                          ((1, 2, 6, 8), {"scale": 2})])
def test_from_pooling_matches_torch_max_unpool2d(shape, block):
    torch = pytest.importorskip("torch")
    x = numpy.random.default_rng(0).standard_normal(shape)
    p, mask = pooled(x)
    layer, bottom, top = run(block, p, mask)
    # the forks' TestForwardFromPool: each nonzero output is the pooled input at its place
    y = top.data
    nonzero = y != 0
    numpy.testing.assert_array_equal(y[nonzero], x[:, :, :y.shape[2], :y.shape[3]][nonzero])
    assert (~nonzero).sum() == y.size - p.size
    pt = torch.tensor(p, requires_grad=True)
    yt = torch.nn.functional.max_unpool2d(pt, torch.tensor(mask).long(), 2, 2, output_size=y.shape[2:])
    gy = numpy.random.default_rng(1).standard_normal(y.shape)
    (yt * torch.tensor(gy)).sum().backward()
    numpy.testing.assert_array_equal(y, yt.detach().numpy())
    top.diff[...] = gy
    layer.backward([top], [True, False], bottom)
    numpy.testing.assert_array_equal(bottom[0].diff, pt.grad.numpy())


def test_gradient():
    x = numpy.random.default_rng(2).standard_normal((2, 2, 4, 6))
    p, mask = pooled(x)
    bottom = [make_blob(p), make_blob(mask)]
    assert check_gradient(upsample({"scale": 2}), bottom, [Blob((), numpy.float64)], check_bottom=[0]) == p.size


def test_a_mask_outside_the_output_is_an_error():
    with pytest.raises(DataError, match="mask value 20 at position 3 is outside the 4x4 output"):
        run({"scale": 2}, numpy.ones((1, 1, 2, 2)), numpy.array([0.0, 1, 2, 20]).reshape(1, 1, 2, 2))


@pytest.mark.parametrize("block, message", [({"upsample_h": 4}, "give both upsample_h and upsample_w"),
                                            ({"scale": 2, "scale_h": 2, "scale_w": 2}, "give scale, or scale_h"),
                                            ({"scale": 3, "pad_out_w": True}, "pad_out_w needs a scale of 2")])
def test_bad_parameters(block, message):
    with pytest.raises(ConfigError, match=message):
        upsample(block)
