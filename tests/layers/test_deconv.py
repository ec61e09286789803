"""Deconvolution and the N-d convolution path: PyTorch's conv_transpose2d/3d and conv3d as references,
finite-difference gradients, both convolution engines, and Caffe prototxt (with Im2col)."""
import numpy
import pytest

from layerforge import Net
from layerforge.backend import to_numpy
from layerforge.blob import Blob
from layerforge.errors import ShapeError
from layerforge.layers import create_layer
from layerforge.testing import check_gradient, make_blob

torch = pytest.importorskip("torch")
RS = numpy.random.RandomState(3)

GEOMETRIES = [  # num_output, kernel, stride, pad, dilation, group
    (4, 3, 1, 0, 1, 1),
    (6, 3, 2, 1, 1, 2),
    (2, 4, 2, 1, 1, 1),
    (3, 2, 3, 0, 2, 1),
    (4, [3, 2], [2, 1], [1, 0], 1, 1),
]


def deconv(num_output, kernel, stride, pad, dilation, group, engine="AUTO", bias=True):
    return create_layer({"type": "Deconvolution", "convolution": {
        "num_output": num_output, "kernel_size": kernel, "stride": stride, "pad": pad, "dilation": dilation,
        "group": group, "bias_term": bias, "engine": engine,
        "weight_filler": {"type": "gaussian"}, "bias_filler": {"type": "gaussian"}}}, dtype=numpy.float64)


def pair(v):
    return tuple(v) if isinstance(v, list) else (v, v)


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("engine", ["IM2COL", "IMPLICIT"])
def test_deconvolution_matches_conv_transpose2d(geometry, engine):
    num_output, kernel, stride, pad, dilation, group = geometry
    x = RS.randn(2, 4, 5, 6)
    layer = deconv(*geometry, engine=engine)
    bottom, top = [make_blob(x)], [Blob(dtype=numpy.float64)]
    layer.setup(bottom, top)
    w, b = layer.blobs[0].data, layer.blobs[1].data
    assert w.shape == (4, num_output // group) + pair(kernel)  # Caffe's (Cin, Cout / G, kh, kw)
    layer.forward(bottom, top)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ref = torch.nn.functional.conv_transpose2d(tx, tw, tb, stride=pair(stride), padding=pair(pad),
                                               dilation=pair(dilation), groups=group)
    numpy.testing.assert_allclose(top[0].data, ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    gy = RS.randn(*top[0].shape)
    top[0].diff[...] = gy
    layer.backward(top, [True], bottom)
    ref.backward(torch.tensor(gy))
    numpy.testing.assert_allclose(bottom[0].diff, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    numpy.testing.assert_allclose(layer.blobs[0].diff, tw.grad.numpy(), rtol=1e-10, atol=1e-12)
    numpy.testing.assert_allclose(layer.blobs[1].diff, tb.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("geometry", GEOMETRIES[:3])
def test_deconvolution_gradient_check(geometry):
    check_gradient(deconv(*geometry), [make_blob(RS.randn(2, 4, 3, 4))], [Blob()], max_checks=60)


def test_deconvolution_output_size_and_bias_off():
    layer = deconv(3, 4, 2, 1, 1, 1, bias=False)
    top = [Blob(dtype=numpy.float64)]
    layer.setup([make_blob(RS.randn(1, 2, 5, 7))], top)
    assert top[0].shape == (1, 3, (5 - 1) * 2 - 2 + 4, (7 - 1) * 2 - 2 + 4) and len(layer.blobs) == 1


def test_deconvolution_and_im2col_from_prototxt(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text("""name: "up"
input: "data" input_dim: 1 input_dim: 2 input_dim: 4 input_dim: 4
layers { name: "up" type: DECONVOLUTION bottom: "data" top: "up"
  convolution_param { num_output: 3 kernel_size: 4 stride: 2 pad: 1 } }
layers { name: "cols" type: IM2COL bottom: "up" top: "cols" convolution_param { kernel_size: 2 stride: 2 } }
""")
    net = Net(str(path), phase="test")
    net.forward(data=numpy.ones((1, 2, 4, 4)))
    assert net.blobs["up"].shape == (1, 3, 8, 8) and net.blobs["cols"].shape == (1, 12, 4, 4)
    assert [b.shape for b in net.params["up"]] == [(2, 3, 4, 4), (3,)]


ND = [  # kernel, stride, pad, dilation, group
    ([3, 3, 3], 1, 0, 1, 1),
    ([2, 3, 2], [2, 1, 2], [1, 0, 1], 1, 2),
    (3, 2, 1, [1, 2, 1], 1),
]


def triple(v):
    return tuple(v) if isinstance(v, list) else (v, v, v)


@pytest.mark.parametrize("type_, x_shape, num_output, geometry", [
    *(("Convolution", (2, 4, 5, 6, 7), 4, g) for g in ND),
    *(("Deconvolution", (2, 4, 3, 4, 3), 2, g) for g in ND[:2])])
def test_3d_matches_conv3d_and_conv_transpose3d(xp, type_, x_shape, num_output, geometry):
    kernel, stride, pad, dilation, group = geometry
    x = RS.randn(*x_shape)
    layer = create_layer({"type": type_, "convolution": {
        "num_output": num_output, "kernel_size": kernel, "stride": stride, "pad": pad, "dilation": dilation,
        "group": group, "weight_filler": {"type": "gaussian"}, "bias_filler": {"type": "gaussian"}}},
        dtype=numpy.float64, xp=xp)
    bottom, top = [make_blob(x, xp=xp)], [Blob((), numpy.float64, xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    tx, tw, tb = (torch.tensor(to_numpy(a), requires_grad=True) for a in (x, *(p.data for p in layer.blobs)))
    op = torch.nn.functional.conv3d if type_ == "Convolution" else torch.nn.functional.conv_transpose3d
    ref = op(tx, tw, tb, stride=triple(stride), padding=triple(pad), dilation=triple(dilation), groups=group)
    numpy.testing.assert_allclose(to_numpy(top[0].data), ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    gy = RS.randn(*top[0].shape)
    top[0].diff[...] = xp.asarray(gy)
    layer.backward(top, [True], bottom)
    ref.backward(torch.tensor(gy))
    for got, want in zip((bottom[0].diff, layer.blobs[0].diff, layer.blobs[1].diff), (tx.grad, tw.grad, tb.grad)):
        numpy.testing.assert_allclose(to_numpy(got), want.numpy(), rtol=1e-10, atol=1e-12)


def test_nd_paths_gradient_check_and_axis():
    x = RS.randn(1, 2, 3, 4, 3)
    for type_ in ("Convolution", "Deconvolution", "Im2col"):
        block = {"kernel_size": 2, "num_output": 2, "weight_filler": {"type": "gaussian"}}
        check_gradient(create_layer({"type": type_, "convolution": block}, dtype=numpy.float64),
                       [make_blob(x)], [Blob()], max_checks=40)
    # axis 2: axes 0 and 1 are batch axes, 2 channels, then two spatial axes (the N-d path)
    layer = create_layer({"type": "Convolution", "convolution": {"num_output": 3, "kernel_size": 2, "axis": 2}},
                         dtype=numpy.float64)
    y = x.reshape(1, 2, 3, 4, 3)
    bottom, top = [make_blob(y)], [Blob(dtype=numpy.float64)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape == (1, 2, 3, 3, 2)
    ref = torch.nn.functional.conv2d(torch.tensor(y.reshape(2, 3, 4, 3)), torch.tensor(layer.blobs[0].data),
                                     torch.tensor(layer.blobs[1].data))
    numpy.testing.assert_allclose(top[0].data.reshape(2, 3, 3, 2), ref.numpy(), rtol=1e-10)


def test_force_nd_im2col_equals_the_2d_path():
    x = RS.randn(2, 3, 6, 5)
    outs = []
    for force in (False, True):
        rng_state = numpy.random.RandomState(9)
        layer = create_layer({"type": "Convolution", "convolution": {"num_output": 4, "kernel_size": 3, "pad": 1,
                                                                     "force_nd_im2col": force}}, dtype=numpy.float64)
        bottom, top = [make_blob(x)], [Blob(dtype=numpy.float64)]
        layer.setup(bottom, top)
        layer.blobs[0].data[...] = rng_state.randn(*layer.blobs[0].shape)
        layer.forward(bottom, top)
        outs.append(top[0].data.copy())
        assert layer.nd == force
    numpy.testing.assert_allclose(outs[0], outs[1], rtol=1e-12)


def test_v1_prototxt_with_3d_convolution_deconvolution_and_im2col_converts_and_runs(tmp_path):
    from layerforge.solvers.caffe_import import convert_file

    path = tmp_path / "net.prototxt"
    path.write_text("""name: "video"
input: "clip" input_shape { dim: 1 dim: 3 dim: 4 dim: 8 dim: 8 }
layers { name: "c3d" type: CONVOLUTION bottom: "clip" top: "c3d"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 stride: 1 stride: 2 stride: 2 axis: 1 } }
layers { name: "up" type: DECONVOLUTION bottom: "c3d" top: "up" convolution_param { num_output: 2
  kernel_size: 1 kernel_size: 2 kernel_size: 2 stride: 1 stride: 2 stride: 2 force_nd_im2col: true } }
layers { name: "cols" type: IM2COL bottom: "up" top: "cols" convolution_param { kernel_size: 2 stride: 2 } }
layers { name: "flat" type: CONVOLUTION bottom: "cols" top: "flat" convolution_param { num_output: 3
  kernel_size: 2 axis: 2 } }
""")
    kind, mapping, notes = convert_file(path)
    layers = {layer["name"]: layer for layer in mapping["layers"]}
    assert [layers[k]["type"] for k in ("c3d", "up", "cols")] == ["Convolution", "Deconvolution", "Im2col"]
    assert layers["c3d"]["convolution"]["stride"] == [1, 2, 2] and layers["flat"]["convolution"]["axis"] == 2
    net = Net(str(path), phase="test")
    clip = RS.randn(1, 3, 4, 8, 8)
    net.forward(clip=clip)
    assert net.blobs["c3d"].shape == (1, 4, 4, 4, 4) and net.params["c3d"][0].shape == (4, 3, 3, 3, 3)
    assert net.blobs["up"].shape == (1, 2, 4, 8, 8) and net.params["up"][0].shape == (4, 2, 1, 2, 2)
    assert net.blobs["cols"].shape == (1, 16, 2, 4, 4)
    assert net.blobs["flat"].shape == (1, 16, 3, 3, 3)  # axis 2: (1, 16) are batch axes, 2 channels
    w, b = (p.data for p in net.params["c3d"])
    ref = torch.nn.functional.conv3d(torch.tensor(clip.astype(w.dtype)), torch.tensor(w), torch.tensor(b),
                                     stride=(1, 2, 2), padding=1)
    numpy.testing.assert_allclose(net.blobs["c3d"].data, ref.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("type_", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("shape", [(1, 4, 5, 5), (1, 4, 3, 5, 5)])
def test_reshape_to_other_channels_is_a_shape_error(type_, shape):
    layer = create_layer({"type": type_, "convolution": {"num_output": 2, "kernel_size": 3}}, dtype=numpy.float64)
    top = [Blob(dtype=numpy.float64)]
    layer.setup([Blob(shape, numpy.float64)], top)
    other = (shape[0], 3) + shape[2:]
    with pytest.raises(ShapeError, match=r"has 3 channels, the weights .* expect 4"):
        layer.reshape([Blob(other, numpy.float64)], top)


@pytest.mark.parametrize("group, cout", [(1, 4), (3, 3)])
def test_caffe_simple_deconvolution(xp, group, cout):
    # Caffe's TestSetup / TestSimpleDeconvolution: (2, 3, 6, 4) of ones, kernel 3, stride 2, weights 1, bias 0.1
    layer = create_layer({"type": "Deconvolution", "convolution": {
        "num_output": cout, "kernel_size": 3, "stride": 2, "group": group,
        "weight_filler": {"type": "constant", "value": 1}, "bias_filler": {"type": "constant", "value": 0.1}}},
        dtype=numpy.float64, xp=xp)
    bottom, top = [make_blob(numpy.ones((2, 3, 6, 4)), xp=xp)], [Blob((), numpy.float64, xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape == (2, cout, 13, 9)
    cin = 3 // group  # input channels summed into each output
    h_overlap = (numpy.arange(13) % 2 == 0) & (numpy.arange(13) > 0) & (numpy.arange(13) < 12)
    w_overlap = (numpy.arange(9) % 2 == 0) & (numpy.arange(9) > 0) & (numpy.arange(9) < 8)
    expected = 0.1 + cin * (1 + h_overlap[:, None]) * (1 + w_overlap[None, :])
    numpy.testing.assert_allclose(to_numpy(top[0].data), numpy.broadcast_to(expected, (2, cout, 13, 9)), rtol=1e-12)


def test_bilinear_upsampling_as_caffe_documents(xp):
    # Caffe's BilinearFiller recipe: factor 2 -> kernel 4, stride 2, pad 1, group = channels, no bias;
    # the result is bilinear interpolation: a linear ramp stays a ramp, at half the step, away from the border
    layer = create_layer({"type": "Deconvolution", "convolution": {
        "num_output": 3, "group": 3, "kernel_size": 4, "stride": 2, "pad": 1, "bias_term": False,
        "weight_filler": {"type": "bilinear"}}}, dtype=numpy.float64, xp=xp)
    x = numpy.broadcast_to(numpy.arange(6.0), (2, 3, 5, 6)) * numpy.array([1.0, -2.0, 0.5])[:, None, None]
    bottom, top = [make_blob(x, xp=xp)], [Blob((), numpy.float64, xp)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    y = to_numpy(top[0].data)
    assert y.shape == (2, 3, 10, 12)
    ramp = (numpy.arange(12.0) - 0.5) / 2  # output column j sits at input coordinate (j - 0.5) / 2
    numpy.testing.assert_allclose(y[:, :, 1:-1, 1:-1], numpy.broadcast_to(
        ramp[1:-1] * numpy.array([1.0, -2.0, 0.5])[:, None, None], (2, 3, 8, 10)), rtol=1e-12, atol=1e-12)
