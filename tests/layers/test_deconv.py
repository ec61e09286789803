"""Deconvolution and Im2col: PyTorch's conv_transpose2d and unfold as references, finite-difference gradients,
both convolution engines, and Caffe prototxt."""
import numpy
import pytest

from layerforge import Net
from layerforge.blob import Blob
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


@pytest.mark.parametrize("kernel,stride,pad,dilation", [(3, 1, 1, 1), (2, 2, 0, 1), ([3, 2], [2, 1], [1, 0], 2)])
def test_im2col_matches_unfold(kernel, stride, pad, dilation):
    x = RS.randn(2, 3, 6, 7)
    layer = create_layer({"type": "Im2col", "convolution": {"kernel_size": kernel, "stride": stride, "pad": pad,
                                                            "dilation": dilation}}, dtype=numpy.float64)
    bottom, top = [make_blob(x)], [Blob(dtype=numpy.float64)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    cols = torch.nn.functional.unfold(torch.tensor(x), pair(kernel), dilation=pair(dilation), padding=pair(pad),
                                      stride=pair(stride))
    numpy.testing.assert_allclose(top[0].data.reshape(2, top[0].shape[1], -1), cols.numpy())
    check_gradient(create_layer({"type": "Im2col", "convolution": {"kernel_size": kernel, "stride": stride,
                                                                   "pad": pad, "dilation": dilation}},
                                dtype=numpy.float64), [make_blob(x[:1, :2])], [Blob()], max_checks=60)


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
