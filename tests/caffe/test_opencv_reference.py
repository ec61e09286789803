"""Deploy nets run by layerforge and by OpenCV 4's Caffe importer (an independent implementation) agree.

Each net gets random trained-looking weights (He-scaled gaussians, small biases) written as a .caffemodel
by layerforge's writer; both run the same input, and every blob's final value (the output of the last layer
that writes it) agrees within 1e-3 of the blob's scale. The nets: the BVLC deploy LeNet and the deploy forms
of the BVLC CIFAR-10, AlexNet and GoogLeNet train_val files (data layers replaced by the input they would
give, losses by Softmax, as Caffe's own deploy files are made), and a small net written here, which runs
wherever the BVLC files are absent. The fork-dialect tests add ``pooling_param { ceil_mode: ... }``, which
OpenCV reads (false: floor the output size) and layerforge's converter does not accept yet.
"""
import re
import unittest.mock

import numpy
import pytest
from google.protobuf import text_format

from layerforge.caffe import caffe_pb
from layerforge.caffe.caffemodel import save_caffemodel
from layerforge.net import Net
from tests.caffe import opencv_caffe
from tests.caffe.test_convert import MODELS

# deploy net -> (the BVLC file it comes from, the input shape); LeNet's deploy file brings its own input
BVLC = {
    "lenet": ("mnist__lenet.prototxt", None),
    "cifar10_quick": ("cifar10__cifar10_quick_train_test.prototxt", (2, 3, 32, 32)),
    "cifar10_full": ("cifar10__cifar10_full_train_test.prototxt", (2, 3, 32, 32)),
    "alexnet": ("bvlc_alexnet__train_val.prototxt", (1, 3, 227, 227)),
    "googlenet": ("bvlc_googlenet__train_val.prototxt", (1, 3, 224, 224)),
}
SLOW = {"alexnet", "googlenet"}  # 61 M and 13 M parameters: a few seconds each

# a small deploy net in the BVLC style, whose pooling sizes differ between ceil and floor rounding
SMALL = """name: "small"
input: "data"
input_shape { dim: 2 dim: 3 dim: 24 dim: 24 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "norm1" type: "LRN" bottom: "pool1" top: "norm1" lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } }
layer { name: "conv2" type: "Convolution" bottom: "norm1" top: "conv2"
        convolution_param { num_output: 12 kernel_size: 3 group: 2 stride: 1 } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool2" top: "fc" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


@pytest.fixture(scope="session")
def opencv():
    """OpenCV with its Caffe importer (OpenCV 4, the dev extra's); a one-line failure without it."""
    try:
        return opencv_caffe.require()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


def deploy_text(name):
    """The deploy prototxt of a BVLC net: test-phase layers, the data layers replaced by a net input of the shape
    they would give, the accuracies dropped and each SoftmaxWithLoss replaced by a Softmax."""
    source, shape = BVLC[name]
    text = (MODELS / source).read_text()
    if shape is None:
        return text
    net = text_format.Parse(text, caffe_pb.NetParameter())
    deploy = caffe_pb.NetParameter(name=net.name, input=["data"])
    deploy.input_shape.add(dim=shape)
    for layer in net.layer:
        if layer.type in ("Data", "Accuracy") or any(rule.phase == caffe_pb.TRAIN for rule in layer.include):
            continue
        kept = deploy.layer.add()
        kept.CopyFrom(layer)
        for field in ("include", "param", "loss_weight", "loss_param"):
            kept.ClearField(field)
        if layer.type == "SoftmaxWithLoss":
            kept.type = "Softmax"
            del kept.bottom[1:]
    return text_format.MessageToString(deploy)


def with_ceil_mode(text, ceil):
    """The prototxt with a fork's ``ceil_mode`` written into every pooling_param."""
    return re.sub(r"pooling_param\s*\{", f"pooling_param {{ ceil_mode: {'true' if ceil else 'false'}", text)


def trained_looking(net, rng):
    """He-scaled gaussian weights and small gaussian biases, so that activations stay near unit scale."""
    for _, blobs in net.param_keys():
        weight = blobs[0]
        fan_in = weight.count // weight.shape[0]
        weight.data[...] = rng.standard_normal(weight.shape) * numpy.sqrt(2.0 / fan_in)
        for bias in blobs[1:]:
            bias.data[...] = rng.standard_normal(bias.shape) * 0.1


def compare_with_opencv(text, opencv, tmp_path, init=trained_looking, tolerance=1e-3, rows=(), inputs=None):
    """Run the deploy net ``text`` in layerforge and OpenCV; assert every blob's final value agrees.

    ``init(net, rng)`` gives the weights; a blob agrees when within ``tolerance`` of its largest magnitude
    (relative too, at 1e-3); the blobs named in ``rows`` (detection lists, (1, 1, D, 7)) are compared as sets of
    rows: OpenCV's all-zero padding rows dropped, both sorted. ``inputs``: {name: array}, default gaussian of the
    net's input shapes (a different shape reshapes the net first, as OpenCV's setInput does).
    """
    prototxt = tmp_path / "deploy.prototxt"
    prototxt.write_text(text)
    with unittest.mock.patch("layerforge.layers.base.fill"):  # init draws every parameter: the fillers' are never seen
        net = Net(str(prototxt), phase="test")
    rng = numpy.random.default_rng(0)
    init(net, rng)
    save_caffemodel(net, tmp_path / "deploy.caffemodel")
    if inputs is None:
        inputs = {name: rng.standard_normal(net.blobs[name].shape).astype(numpy.float32) for name in net.inputs}
    net.forward(**inputs)
    last_writer = {}  # blob -> the last layer writing it (in-place layers overwrite their bottom)
    for i, layer in enumerate(net.layers):
        if layer.type not in ("Split", "Input"):
            last_writer.update((top, layer.name) for top in net.top_names(i))
    theirs = opencv_caffe.run(prototxt, tmp_path / "deploy.caffemodel", inputs, list(last_writer.values()))
    for blob, layer in last_writer.items():
        ours, reference = numpy.asarray(net.blobs[blob].data), theirs[layer]
        if blob in rows:
            ours, reference = sorted_rows(ours), sorted_rows(reference)
            assert ours.shape == reference.shape, f"blob '{blob}': {len(ours)} detections, OpenCV {len(reference)}"
        else:
            reference = reference.reshape(ours.shape)
        scale = float(numpy.abs(reference).max(initial=0.0)) or 1.0
        numpy.testing.assert_allclose(ours, reference, rtol=min(tolerance, 1e-3), atol=tolerance * scale,
                                      err_msg=f"blob '{blob}' (layer '{layer}')")
    return net


def sorted_rows(detections):
    """A (1, 1, D, 7) detection list as its rows sorted by image, label, score, box (OpenCV's zero rows dropped)."""
    found = numpy.asarray(detections, dtype=numpy.float64).reshape(-1, 7)
    found = found[numpy.abs(found).sum(axis=1) > 0]
    return found[numpy.lexsort(found.T[::-1])]


def bvlc_nets():
    return [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else []) for name in BVLC]


needs_models = pytest.mark.skipif(not (MODELS / BVLC["lenet"][0]).exists(),
                                  reason=f"the BVLC Caffe model files are not here ({MODELS})")


def test_a_small_deploy_net_agrees_with_opencv(opencv, tmp_path):
    net = compare_with_opencv(SMALL, opencv, tmp_path)
    assert net.blobs["pool1"].shape == (2, 8, 12, 12)  # Caffe rounds up: ceil((24 - 3) / 2) + 1


@needs_models
@pytest.mark.parametrize("name", bvlc_nets())
def test_bvlc_deploy_nets_agree_with_opencv(opencv, tmp_path, name):
    compare_with_opencv(deploy_text(name), opencv, tmp_path)


@pytest.mark.parametrize("ceil, pool1", [(False, 11), (True, 12)])
def test_ceil_mode_of_caffe_forks_agrees_with_opencv(opencv, tmp_path, ceil, pool1):
    net = compare_with_opencv(with_ceil_mode(SMALL, ceil), opencv, tmp_path)
    assert net.blobs["pool1"].shape == (2, 8, pool1, pool1)


@needs_models
@pytest.mark.parametrize("ceil", [False, True])
@pytest.mark.parametrize("name", [n for n in BVLC if n not in SLOW] + [pytest.param("alexnet", marks=pytest.mark.slow)])
def test_bvlc_deploy_nets_with_ceil_mode_agree_with_opencv(opencv, tmp_path, name, ceil):
    # GoogLeNet's last 7x7 pooling does not fit a floored 6x6 map: it is left out
    compare_with_opencv(with_ceil_mode(deploy_text(name), ceil), opencv, tmp_path)


def test_a_missing_importer_is_one_line_naming_the_dev_extra(monkeypatch):
    import cv2

    monkeypatch.delattr(cv2.dnn, "readNetFromCaffe")
    with pytest.raises(RuntimeError) as e:
        opencv_caffe.require()
    assert "\n" not in str(e.value) and "pip install -e '.[dev]'" in str(e.value) and cv2.__version__ in str(e.value)
