"""caffe.coord_map: the coordinate maps of FCN-style conv / pool / deconv / crop chains (what pycaffe's
test_coord_map.py checks, in this project's words), and the Crop layer it makes builds and aligns."""
import numpy
import pytest

import layerforge.pycaffe as caffe
from layerforge.pycaffe import layers as L, params as P
from layerforge.pycaffe.coord_map import (AxisMismatchException, compose, coord_map, coord_map_from_to, crop,
                                          inverse)


def conv_pool_deconv(kernel=3, stride=1, pad=0, pool=2, up=2, up_pad=0, data=(2, 1, 100, 100)):
    """data -> conv -> max pool (pool x pool) -> deconv upsampling by ``up`` (kernel 2 * up)."""
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=list(data)))
    n.aux = L.Input(shape=dict(dim=[2, 1, 20, 20]))
    n.conv = L.Convolution(n.data, num_output=10, kernel_size=kernel, stride=stride, pad=pad)
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=pool, stride=pool, pad=0)
    up_kernel = [2 * s for s in up] if isinstance(up, list) else 2 * up
    n.deconv = L.Deconvolution(n.pool, num_output=10, kernel_size=up_kernel, stride=up, pad=up_pad)
    return n


@pytest.mark.parametrize("factor,shift", [(2, 0), (4, -1), (8, -3)])
def test_matching_pool_and_upsampling_give_scale_one(factor, shift):
    ax, a, b = coord_map_from_to(*_ends(conv_pool_deconv(pool=factor, up=factor)))
    assert (ax, a, b) == (1, 1, shift)


@pytest.mark.parametrize("pad", [1, 3, 10])
def test_conv_padding_shifts_one_way_and_deconv_padding_the_other(pad):
    _, a0, b0 = coord_map_from_to(*_ends(conv_pool_deconv()))
    _, a, b = coord_map_from_to(*_ends(conv_pool_deconv(pad=pad)))
    assert (a, b) == (a0, b0 - pad)
    _, a, b = coord_map_from_to(*_ends(conv_pool_deconv(up_pad=pad)))
    assert (a, b) == (a0, b0 + pad)
    _, a, b = coord_map_from_to(*_ends(conv_pool_deconv(pad=pad, up_pad=pad)))
    assert (a, b) == (a0, b0)


def _ends(n):
    return n.deconv, n.data


def test_pointwise_layers_and_1x1_convolutions_are_identities():
    n = conv_pool_deconv()
    reference = coord_map_from_to(n.deconv, n.data)
    n.relu = L.ReLU(n.deconv)
    n.bn = L.BatchNorm(n.relu)
    n.one = L.Convolution(n.bn, num_output=10, kernel_size=1, stride=1, pad=0)
    for top in (n.relu, n.bn, n.one):
        assert coord_map_from_to(top, n.data) == reference


def test_every_bottom_of_a_layer_maps_alike():
    n = conv_pool_deconv()
    n.conv_data, n.conv_aux = L.Convolution(n.data, n.aux, ntop=2, num_output=10, kernel_size=5, stride=2, pad=0)
    assert coord_map_from_to(n.conv_data, n.data) == coord_map_from_to(n.conv_aux, n.aux) == (1, 2, 2)  # output y sits at 2y + 2


def test_per_axis_parameters_map_each_axis_separately():
    square3 = coord_map_from_to(*_ends(conv_pool_deconv(kernel=3, stride=1, pad=0)))
    square5 = coord_map_from_to(*_ends(conv_pool_deconv(kernel=5, stride=2, pad=10)))
    ax, a, b = coord_map_from_to(*_ends(conv_pool_deconv(kernel=[3, 5], stride=[1, 2], pad=[0, 10])))
    assert ax == square3[0] == square5[0]
    assert (a[0], b[0]) == square3[1:] and (a[1], b[1]) == square5[1:]


def test_three_spatial_axes():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3, 100, 100, 100]))
    n.conv = L.Convolution(n.data, num_output=10, kernel_size=[3, 3, 3], stride=[1, 1, 1], pad=[0, 1, 2])
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=2, stride=2, pad=0)
    n.deconv = L.Deconvolution(n.pool, num_output=10, kernel_size=4, stride=2, pad=0)
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert ax == 1 and numpy.all(a == 1)
    numpy.testing.assert_array_equal(b, [0, -1, -2])  # each pixel of padding moves its axis by one


@pytest.mark.parametrize("offset", [0, 3, 10])
def test_crop_of_a_crop_adds_its_offset(offset):
    n = conv_pool_deconv()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    n.crop = L.Crop(n.deconv, n.data, axis=2, offset=offset)
    assert coord_map_from_to(n.crop, n.data) == (ax, a, b + offset)


def test_crop_helper_builds_a_net_whose_output_is_aligned_with_the_input(tmp_path):
    n = conv_pool_deconv(pool=4, up=4, data=(1, 1, 37, 41))
    n.score = crop(n.deconv, n.data)
    layer = n.to_proto().layer[-1]
    assert layer.type == "Crop" and layer.crop_param.axis == 2 and list(layer.crop_param.offset) == [1]
    path = tmp_path / "fcn.prototxt"
    path.write_text(str(n.to_proto()))
    net = caffe.Net(str(path), caffe.TEST)
    net.forward()
    assert net.blobs["score"].data.shape == (1, 10, 37, 41)


@pytest.mark.parametrize("kwargs,reason", [
    (dict(pool=3, up=2), "different scales"),  # pooled 3x, upsampled 2x
    (dict(up_pad=10), "negative offset"),  # the upsampled map is smaller than the input
    (dict(kernel=4, pad=1), "whole number"),  # an even kernel puts the centre between pixels
])
def test_crop_refuses_what_cannot_be_cropped(kwargs, reason):
    n = conv_pool_deconv(**kwargs)
    with pytest.raises(AssertionError, match=reason):
        crop(n.deconv, n.data)


def test_unconnected_tops_have_no_map():
    n = conv_pool_deconv()
    n.ip = L.InnerProduct(n.deconv, num_output=10)
    with pytest.raises(RuntimeError, match="not connected"):
        coord_map_from_to(n.ip, n.data)


def test_compose_and_inverse_are_affine_maps():
    m = (1, 0.5, -1.5)
    assert compose(m, inverse(m)) == (1, 1.0, 0.0)
    assert compose((None, 1, 0), m) == m and compose(m, (None, 1, 0)) == m
    with pytest.raises(AxisMismatchException):
        compose((1, 1, 0), (2, 1, 0))
    n = conv_pool_deconv(kernel=3, stride=1, pad=0)
    assert coord_map(n.conv.fn) == (1, 1.0, -1.0)  # a 3x3 valid convolution's output pixel 0 sits at input 1
    dilated = L.Convolution(n.data, num_output=1, kernel_size=3, dilation=2)
    assert coord_map(dilated.fn) == (1, 1.0, -2.0)
