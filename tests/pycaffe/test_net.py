"""caffe.Net as pycaffe's own tests (python/caffe/test/test_net.py) use it, through layerforge.pycaffe."""
import collections

import numpy
import pytest

import layerforge.pycaffe as caffe
from layerforge.errors import LayerforgeError

pytestmark = pytest.mark.usefixtures("caffe_mode")  # every test in CPU mode and in GPU mode

NUM_OUTPUT = 13


def simple_net_file(tmp_path, num_output=NUM_OUTPUT, name="net"):
    """The small net of Caffe's test_net.cpp as prototxt, in a file without an extension."""
    path = tmp_path / name
    path.write_text("""name: 'testnet' force_backward: true
    layer { type: 'DummyData' name: 'data' top: 'data' top: 'label'
      dummy_data_param { num: 5 channels: 2 height: 3 width: 4
        num: 5 channels: 1 height: 1 width: 1
        data_filler { type: 'gaussian' std: 1 }
        data_filler { type: 'constant' } } }
    layer { type: 'Convolution' name: 'conv' bottom: 'data' top: 'conv'
      convolution_param { num_output: 11 kernel_size: 2 pad: 3
        weight_filler { type: 'gaussian' std: 1 }
        bias_filler { type: 'constant' value: 2 } }
        param { decay_mult: 1 } param { decay_mult: 0 } }
    layer { type: 'InnerProduct' name: 'ip' bottom: 'conv' top: 'ip_blob'
      inner_product_param { num_output: """ + str(num_output) + """
        weight_filler { type: 'gaussian' std: 2.5 }
        bias_filler { type: 'constant' value: -3 } } }
    layer { type: 'SoftmaxWithLoss' name: 'loss' bottom: 'ip_blob' bottom: 'label' top: 'loss' }""")
    return str(path)


@pytest.fixture
def net(tmp_path):
    net = caffe.Net(simple_net_file(tmp_path), caffe.TRAIN)
    net.blobs["label"].data[...] = numpy.random.RandomState(0).randint(NUM_OUTPUT, size=net.blobs["label"].data.shape)
    return net


def test_memory_outlives_the_net(net):
    params = [p for ps in net.params.values() for p in ps]
    blobs = list(net.blobs.values())
    del net
    total = sum(float(p.data.sum() + p.diff.sum()) for p in params) + sum(float(b.data.sum()) for b in blobs)
    assert numpy.isfinite(total)


def test_layer_dict_and_names(net):
    assert list(net.layer_dict) == net._layer_names == ["data", "conv", "ip", "loss"]
    for i, name in enumerate(net._layer_names):
        assert net.layer_dict[name].type == net.layers[i].type


def test_forward_backward_and_clear_diffs(net):
    net.forward()
    net.backward()
    diff = net.params["conv"][0].diff
    assert diff.max() > 0
    net.clear_param_diffs()
    # on a GPU a kept array shows the device's values once its blob is read again (Caffe's SyncedMemory); on the
    # CPU it is the blob's own array
    assert (net.params["conv"][0].diff == 0).all()
    assert (diff == 0).all()


def test_forward_start_end_returns_the_end_layers_tops(net):
    conv = net.blobs["conv"]
    conv.data[...] = numpy.random.RandomState(1).uniform(size=conv.data.shape)
    out = net.forward(start="ip", end="ip")
    assert list(out) == ["ip_blob"]
    w, b = net.params["ip"][0].data, net.params["ip"][1].data
    manual = conv.data.reshape(conv.data.shape[0], -1) @ w.T + b
    numpy.testing.assert_allclose(net.blobs["ip_blob"].data, manual, rtol=1e-3, atol=1e-5)


def test_backward_start_end_returns_the_end_layers_bottom_diffs(net):
    net.forward()
    ip = net.blobs["ip_blob"]
    sample = numpy.random.RandomState(2).uniform(size=ip.data.shape).astype(numpy.float32)
    ip.diff[...] = sample
    out = net.backward(start="ip", end="ip")
    assert list(out) == ["conv"]
    manual = (sample @ net.params["ip"][0].data).reshape(net.blobs["conv"].data.shape)
    numpy.testing.assert_allclose(net.blobs["conv"].diff, manual, rtol=1e-3, atol=1e-5)


def test_inputs_outputs_top_bottom_names(net):
    assert net.inputs == [] and net.outputs == ["loss"]
    assert net.top_names == collections.OrderedDict(
        [("data", ["data", "label"]), ("conv", ["conv"]), ("ip", ["ip_blob"]), ("loss", ["loss"])])
    assert net.bottom_names == collections.OrderedDict(
        [("data", []), ("conv", ["data"]), ("ip", ["conv"]), ("loss", ["ip_blob", "label"])])
    assert net.blob_loss_weights == collections.OrderedDict(
        [("data", 0.0), ("label", 0.0), ("conv", 0.0), ("ip_blob", 0.0), ("loss", 1.0)])


def test_blob_legacy_axes(net):
    data = net.blobs["data"]
    assert (data.num, data.channels, data.height, data.width) == (5, 2, 3, 4)
    assert net.blobs["ip_blob"].height == 1 and data.count == 120


def test_save_and_read_both_constructors(net, tmp_path):
    weights = str(tmp_path / "w.npz")
    net.save(weights)
    with pytest.warns(DeprecationWarning):
        legacy = caffe.Net(simple_net_file(tmp_path, name="n2"), weights, caffe.TRAIN)
    named = caffe.Net(simple_net_file(tmp_path, name="n3"), caffe.TRAIN, weights=weights)
    for other in (legacy, named):
        for name in net.params:
            for a, b in zip(net.params[name], other.params[name]):
                assert numpy.abs(a.data - b.data).sum() == 0


def test_share_with_uses_the_same_weights(net, tmp_path):
    other = caffe.Net(simple_net_file(tmp_path, name="n2"), caffe.TEST)
    other.share_with(net)
    net.params["ip"][0].data[...] = 0.5
    numpy.testing.assert_array_equal(other.params["ip"][0].data, 0.5)


def test_forward_all_pads_the_last_batch(tmp_path):
    path = tmp_path / "deploy"
    path.write_text("force_backward: true input: 'data' input_shape { dim: 4 dim: 3 }\n"
                    "layer { type: 'InnerProduct' name: 'ip' bottom: 'data' top: 'ip'\n"
                    "  inner_product_param { num_output: 2 weight_filler { type: 'gaussian' } } }\n")
    net = caffe.Net(str(path), caffe.TEST)
    x = numpy.random.RandomState(3).randn(10, 3).astype(numpy.float32)
    out = net.forward_all(data=x)
    w, b = net.params["ip"][0].data, net.params["ip"][1].data
    assert out["ip"].shape == (10, 2)
    numpy.testing.assert_allclose(out["ip"], x @ w.T + b, rtol=1e-5, atol=1e-6)
    outs, diffs = net.forward_backward_all(data=x, ip=numpy.ones((10, 2), numpy.float32))
    assert diffs["data"].shape == (10, 3)
    numpy.testing.assert_allclose(diffs["data"], numpy.ones((10, 2)) @ w, rtol=1e-5)
    with pytest.raises(LayerforgeError, match="do not match"):
        net.forward(wrong=x[:4])


LEVELS = """
layer { name: "data" type: "DummyData" top: "data" dummy_data_param { shape { dim: 1 dim: 1 dim: 10 dim: 10 } } }
layer { name: "NoLevel" type: "InnerProduct" bottom: "data" top: "NoLevel" inner_product_param { num_output: 1 } }
layer { name: "Level0Only" type: "InnerProduct" bottom: "data" top: "Level0Only"
  include { min_level: 0 max_level: 0 } inner_product_param { num_output: 1 } }
layer { name: "Level1Only" type: "InnerProduct" bottom: "data" top: "Level1Only"
  include { min_level: 1 max_level: 1 } inner_product_param { num_output: 1 } }
layer { name: "Level>=0" type: "InnerProduct" bottom: "data" top: "Level>=0"
  include { min_level: 0 } inner_product_param { num_output: 1 } }
layer { name: "Level>=1" type: "InnerProduct" bottom: "data" top: "Level>=1"
  include { min_level: 1 } inner_product_param { num_output: 1 } }
"""

STAGES = """
layer { name: "data" type: "DummyData" top: "data" dummy_data_param { shape { dim: 1 dim: 1 dim: 10 dim: 10 } } }
layer { name: "A" type: "InnerProduct" bottom: "data" top: "A" include { stage: "A" } inner_product_param { num_output: 1 } }
layer { name: "B" type: "InnerProduct" bottom: "data" top: "B" include { stage: "B" } inner_product_param { num_output: 1 } }
layer { name: "AorB" type: "InnerProduct" bottom: "data" top: "AorB" include { stage: "A" } include { stage: "B" }
  inner_product_param { num_output: 1 } }
layer { name: "AandB" type: "InnerProduct" bottom: "data" top: "AandB" include { stage: "A" stage: "B" }
  inner_product_param { num_output: 1 } }
"""


@pytest.mark.parametrize("text,kwargs,blobs", [
    (LEVELS, {}, ["NoLevel", "Level0Only", "Level>=0"]),
    (LEVELS, {"level": 1}, ["NoLevel", "Level1Only", "Level>=0", "Level>=1"]),
    (STAGES, {"stages": ["A"]}, ["A", "AorB"]),
    (STAGES, {"stages": ["B"]}, ["B", "AorB"]),
    (STAGES, {"stages": ["A", "B"]}, ["A", "B", "AorB", "AandB"]),
])
def test_levels_and_stages(tmp_path, text, kwargs, blobs):
    path = tmp_path / "net"
    path.write_text(text)
    net = caffe.Net(str(path), caffe.TEST, **kwargs)
    assert [b for b in net.blobs if "data" not in b] == blobs


ALL_IN_ONE = """
layer { name: "train_data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 1 dim: 1 dim: 10 dim: 10 } shape { dim: 1 dim: 1 dim: 1 dim: 1 } }
  include { phase: TRAIN stage: "train" } }
layer { name: "val_data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 1 dim: 1 dim: 10 dim: 10 } shape { dim: 1 dim: 1 dim: 1 dim: 1 } }
  include { phase: TEST stage: "val" } }
layer { name: "deploy_data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 1 dim: 10 dim: 10 } }
  include { phase: TEST stage: "deploy" } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss"
  include: { phase: TRAIN stage: "train" } include: { phase: TEST stage: "val" } }
layer { name: "pred" type: "Softmax" bottom: "ip" top: "pred" include: { phase: TEST stage: "deploy" } }
"""


@pytest.mark.parametrize("phase,stage,outputs", [
    (caffe.TRAIN, "train", ["loss"]), (caffe.TEST, "val", ["loss"]), (caffe.TEST, "deploy", ["pred"])])
def test_all_in_one(tmp_path, phase, stage, outputs):
    path = tmp_path / "net"
    path.write_text(ALL_IN_ONE)
    net = caffe.Net(str(path), phase, stages=[stage])
    assert list(net.blobs["data"].shape) == [1, 1, 10, 10]
    assert net.outputs == outputs


def test_save_hdf5_and_load_hdf5(net, tmp_path):
    path = str(tmp_path / "weights")  # no extension, as pycaffe's test uses a temp file
    net.save_hdf5(path)
    other = caffe.Net(simple_net_file(tmp_path, name="n2"), caffe.TRAIN)
    other.load_hdf5(path)
    for name in net.params:
        for a, b in zip(net.params[name], other.params[name]):
            assert numpy.abs(a.data - b.data).sum() == 0


def test_saved_weights_are_a_caffemodel(net, tmp_path):
    from layerforge.caffe import caffe_pb

    path = tmp_path / "w"
    net.save(str(path))
    proto = caffe_pb.NetParameter()
    proto.ParseFromString(path.read_bytes())
    conv = [layer for layer in proto.layer if layer.name == "conv"][0]
    assert list(conv.blobs[0].shape.dim) == [11, 2, 2, 2]
    numpy.testing.assert_allclose(numpy.array(conv.blobs[0].data).reshape(11, 2, 2, 2), net.params["conv"][0].data)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_saved_weights_honour_the_umask(net, tmp_path, umask, mode):
    import os
    import stat

    old = os.umask(umask)
    try:
        net.save(str(tmp_path / "w.caffemodel"))
        net.save_hdf5(str(tmp_path / "w.h5"))
    finally:
        os.umask(old)
    for name in ("w.caffemodel", "w.h5"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == mode, name
