"""Caffe's messages (layerforge.caffe.caffe_pb) and .caffemodel / .caffemodel.h5 weights (caffemodel.py)."""
import argparse
import logging
import struct

import h5py
import numpy
import pytest

from layerforge import Net
from layerforge.caffe import caffe_pb
from layerforge.caffe.caffemodel import (array_to_blob, blob_to_array, copy_trained_layers, net_to_proto, save_caffemodel,
                                         save_hdf5)
from layerforge.solvers.caffe_import import convert_file
from layerforge.commands import convert as convert_command
from layerforge.errors import LayerforgeError


def tiny_net(dtype="float32", share=False):
    """x (2, 1, 4, 4) -> conv (3 maps, 3x3) -> ip (2 outputs) [-> ip2 sharing ip's weights]."""
    layers = [
        {"name": "x", "type": "Input", "top": ["x"], "input": {"shape": [2, 1, 4, 4]}},
        {"name": "conv", "type": "Convolution", "bottom": "x", "top": "c",
         "convolution": {"num_output": 3, "kernel_size": 3, "weight_filler": {"type": "gaussian"},
                         "bias_filler": {"type": "gaussian"}}},
        {"name": "ip", "type": "InnerProduct", "bottom": "c", "top": "y", "param": [{"name": "w"}],
         "inner_product": {"num_output": 2, "weight_filler": {"type": "gaussian"}, "bias_filler": {"type": "gaussian"}}},
    ]
    if share:
        layers.append({"name": "ip2", "type": "InnerProduct", "bottom": "c", "top": "z", "param": [{"name": "w"}],
                       "inner_product": {"num_output": 2}})
    return Net({"name": "tiny", "layers": layers}, phase="test", dtype=dtype)


def params_of(net):
    return {f"{n}/{j}": b.data.copy() for n, blobs in net.params.items() for j, b in enumerate(blobs)}


def varint(n):
    out = b""
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return out


# ------------------------------------------------------------------------------------------
# the schema

def test_messages_have_caffes_names_numbers_and_enums():
    assert caffe_pb.NetParameter.DESCRIPTOR.full_name == "caffe.NetParameter"
    fields = caffe_pb.BlobProto.DESCRIPTOR.fields_by_name
    assert {k: fields[k].number for k in ("num", "channels", "height", "width", "data", "diff", "shape",
                                          "double_data", "double_diff")} == \
        {"num": 1, "channels": 2, "height": 3, "width": 4, "data": 5, "diff": 6, "shape": 7, "double_data": 8,
         "double_diff": 9}
    assert caffe_pb.NetParameter.DESCRIPTOR.fields_by_name["layer"].number == 100
    assert caffe_pb.NetParameter.DESCRIPTOR.fields_by_name["layers"].number == 2
    assert caffe_pb.V1LayerParameter.DESCRIPTOR.fields_by_name["blobs"].number == 6
    assert [f.name for f in caffe_pb.SolverState.DESCRIPTOR.fields] == ["iter", "learned_net", "history",
                                                                        "current_step", "minimum_loss",
                                                                        "iter_last_event"]  # the last two: SSD's
    assert (caffe_pb.TRAIN, caffe_pb.TEST, caffe_pb.Phase.Name(1)) == (0, 1, "TEST")
    assert caffe_pb.PoolingParameter.AVE == 1 and caffe_pb.V1LayerParameter.INNER_PRODUCT == 14
    assert caffe_pb.SolverParameter.BINARYPROTO == 1 and caffe_pb.NetState().phase == caffe_pb.TEST
    assert caffe_pb.FillerParameter().std == 1.0 and caffe_pb.ConvolutionParameter().bias_term is True
    assert caffe_pb.LayerParameter.DESCRIPTOR.fields_by_name["convolution_param"].number == 106


RICH_NET = """name: "rich"
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN }
  transform_param { mirror: true crop_size: 3 mean_file: "m.binaryproto" }
  data_param { source: "db" batch_size: 4 backend: LMDB } }
layer { name: "c" type: "Convolution" bottom: "data" top: "c" param { lr_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 engine: CAFFE
    weight_filler { type: "msra" variance_norm: FAN_OUT } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "p" type: "Pooling" bottom: "c" top: "p" pooling_param { pool: AVE kernel_size: 2 round_mode: FLOOR } }
layer { name: "bn" type: "BatchNorm" bottom: "p" top: "p" batch_norm_param { use_global_stats: false } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "p" bottom: "label" top: "loss" loss_weight: 1
  loss_param { ignore_label: 255 normalization: VALID } propagate_down: true propagate_down: false }
"""
RICH_SOLVER = """net: "n.prototxt" test_iter: 10 test_interval: 100 base_lr: 0.01 lr_policy: "multistep"
stepvalue: 100 stepvalue: 200 gamma: 0.1 momentum: 0.9 weight_decay: 5e-4 solver_mode: GPU type: "Nesterov"
snapshot_format: HDF5 train_state { stage: "a" } test_state { level: 2 }
"""


def test_caffe_prototxt_text_parses_into_the_messages():
    from google.protobuf import text_format
    net = text_format.Parse(RICH_NET, caffe_pb.NetParameter())
    assert net.layer[0].include[0].phase == caffe_pb.TRAIN and net.layer[0].data_param.backend == 1
    conv = net.layer[1].convolution_param
    assert list(conv.kernel_size) == [3] and conv.weight_filler.variance_norm == caffe_pb.FillerParameter.FAN_OUT
    assert net.layer[1].param[1].decay_mult == 0 and net.layer[2].pooling_param.pool == caffe_pb.PoolingParameter.AVE
    assert net.layer[4].loss_param.normalization == caffe_pb.LossParameter.VALID
    assert caffe_pb.NetParameter.FromString(net.SerializeToString()) == net
    solver = text_format.Parse(RICH_SOLVER, caffe_pb.SolverParameter())
    assert list(solver.stepvalue) == [100, 200] and solver.snapshot_format == caffe_pb.SolverParameter.HDF5
    assert solver.solver_mode == caffe_pb.SolverParameter.GPU and solver.test_state[0].level == 2


def test_blob_wire_layout_is_caffes():
    blob = array_to_blob(numpy.arange(6, dtype=numpy.float32).reshape(2, 3))
    values = struct.pack("<6f", *range(6))
    # data (5, packed floats) then shape (7) holding dim (1, packed int64): field-number order, as Caffe's C++
    assert blob.SerializeToString() == b"\x2a\x18" + values + b"\x3a\x04\x0a\x02\x02\x03"
    legacy = array_to_blob(numpy.zeros((2, 3), numpy.float64), legacy=True)
    assert (legacy.num, legacy.channels, legacy.height, legacy.width) == (1, 1, 2, 3)
    assert list(legacy.double_data) == [0.0] * 6 and not legacy.data and not legacy.HasField("shape")


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64, numpy.float16, numpy.int32])
@pytest.mark.parametrize("shape, order", [((0,), "C"), ((), "C"), ((3,), "C"), ((80, 50), "F"), ((2, 3, 5, 7), "C")])
def test_blob_values_are_the_ones_extend_would_write(dtype, shape, order):
    # array_to_blob writes the packed field's bytes itself (a length of 1, 2 or 3 varint bytes here; Fortran order)
    array = numpy.asarray(numpy.random.default_rng(0).standard_normal(shape) * 100, dtype=dtype, order=order)
    want = caffe_pb.BlobProto()
    want.shape.dim.extend(array.shape)
    if array.dtype == numpy.float64:
        want.double_data.extend(array.ravel().tolist())
    else:
        want.data.extend(array.astype(numpy.float32).ravel().tolist())
    got = array_to_blob(array, caffe_pb.BlobProto(data=[9.0], double_data=[9.0]))  # a given proto is cleared
    assert got.SerializeToString() == want.SerializeToString()
    assert blob_to_array(got).tobytes() == array.astype(numpy.float64 if dtype == numpy.float64 else numpy.float32).tobytes()


def test_unknown_fields_are_kept():
    layer = caffe_pb.LayerParameter(name="conv", type="Convolution")
    layer.convolution_param.num_output = 4
    # field 1000 (varint 5) and field 1001 (bytes "hi") are in no schema of ours
    extra = varint(1000 << 3) + b"\x05" + varint(1001 << 3 | 2) + b"\x02hi"
    raw = caffe_pb.NetParameter(name="n").SerializeToString() + varint(100 << 3 | 2) + \
        varint(len(layer.SerializeToString() + extra)) + layer.SerializeToString() + extra
    parsed = caffe_pb.NetParameter.FromString(raw)
    assert parsed.layer[0].name == "conv" and parsed.layer[0].convolution_param.num_output == 4
    assert parsed.SerializeToString() == raw


# ------------------------------------------------------------------------------------------
# writing and reading .caffemodel

def test_written_caffemodel_decodes_field_by_field(tmp_path):
    net = tiny_net()
    save_caffemodel(net, tmp_path / "w.caffemodel")
    param = caffe_pb.NetParameter.FromString((tmp_path / "w.caffemodel").read_bytes())
    assert param.name == "tiny" and not param.layers
    assert [(lp.name, lp.type, list(lp.bottom), list(lp.top), lp.phase) for lp in param.layer] == [
        ("x", "Input", [], ["x"], caffe_pb.TEST), ("conv", "Convolution", ["x"], ["c"], caffe_pb.TEST),
        ("ip", "InnerProduct", ["c"], ["y"], caffe_pb.TEST)]
    conv = param.layer[1]
    assert [list(b.shape.dim) for b in conv.blobs] == [[3, 1, 3, 3], [3]]
    assert not any(b.HasField("num") or b.double_data or b.diff for b in conv.blobs)
    numpy.testing.assert_array_equal(numpy.array(conv.blobs[0].data, numpy.float32),
                                     net.params["conv"][0].data.ravel())
    assert [list(b.shape.dim) for b in param.layer[2].blobs] == [[2, 12], [2]]
    assert len(param.layer[0].blobs) == 0


def test_round_trip_is_bit_identical(tmp_path):
    a = tiny_net()
    save_caffemodel(a, tmp_path / "a.caffemodel")
    b = tiny_net()
    assert not numpy.array_equal(b.params["conv"][0].data, a.params["conv"][0].data)
    b.copy_from(str(tmp_path / "a.caffemodel"))
    for key, value in params_of(a).items():
        assert params_of(b)[key].tobytes() == value.tobytes()
    save_caffemodel(b, tmp_path / "b.caffemodel")
    assert (tmp_path / "a.caffemodel").read_bytes() == (tmp_path / "b.caffemodel").read_bytes()


def test_float64_net_writes_double_data(tmp_path):
    net = tiny_net("float64")
    param = net_to_proto(net)
    blob = param.layer[2].blobs[0]
    assert len(blob.double_data) == 24 and not blob.data
    save_caffemodel(net, tmp_path / "d.caffemodel")
    other = tiny_net("float64")
    other.copy_from(str(tmp_path / "d.caffemodel"))
    numpy.testing.assert_array_equal(other.params["ip"][0].data, net.params["ip"][0].data)


def test_copy_rules_skip_unknown_layers_and_accept_legacy_shapes(tmp_path, caplog):
    net = tiny_net()
    param = caffe_pb.NetParameter(name="other")
    w = numpy.arange(24, dtype=numpy.float32).reshape(2, 12)
    ip = param.layer.add(name="ip", type="InnerProduct")
    array_to_blob(w, ip.blobs.add(), legacy=True)                # (1, 1, 2, 12) as old Caffe wrote it
    array_to_blob(numpy.array([5.0, 6.0], numpy.float32), ip.blobs.add(), legacy=True)
    param.layer.add(name="gone", type="ReLU")
    array_to_blob(numpy.ones(2, numpy.float32), param.layer[-1].blobs.add())
    (tmp_path / "w.caffemodel").write_bytes(param.SerializeToString())
    before = net.params["conv"][0].data.copy()
    with caplog.at_level(logging.INFO, logger="layerforge"):
        assert copy_trained_layers(net, tmp_path / "w.caffemodel") == ["ip"]  # the layers that took weights
    assert "Ignoring source layer gone" in caplog.text
    numpy.testing.assert_array_equal(net.params["ip"][0].data, w)
    numpy.testing.assert_array_equal(net.params["ip"][1].data, [5, 6])
    numpy.testing.assert_array_equal(net.params["conv"][0].data, before)  # not in the file: kept


@pytest.mark.parametrize("blobs, message", [
    ([numpy.zeros((2, 12))], "layer 'ip' has 1 blob(s) in the file but 2 in the net"),
    ([numpy.zeros((12, 2)), numpy.zeros(2)], "layer 'ip' blob 0 has shape (12, 2) in the file but (2, 12) in the net"),
    ([numpy.zeros((2, 12)), numpy.zeros(3)], "layer 'ip' blob 1 has shape (3,) in the file but (2,) in the net"),
])
def test_copy_mismatch_is_one_line_naming_layer_and_shapes(tmp_path, blobs, message):
    param = caffe_pb.NetParameter()
    layer = param.layer.add(name="ip", type="InnerProduct")
    for b in blobs:
        array_to_blob(b.astype(numpy.float32), layer.blobs.add())
    path = tmp_path / "w.caffemodel"
    path.write_bytes(param.SerializeToString())
    with pytest.raises(LayerforgeError) as e:
        tiny_net().copy_from(str(path))
    assert str(e.value) == f"{path}: {message}"


def test_legacy_shape_with_other_count_is_refused(tmp_path):
    blob = caffe_pb.BlobProto(num=1, channels=2, height=2, width=12)
    blob.data.extend([0.0] * 48)
    param = caffe_pb.NetParameter()
    param.layer.add(name="ip").blobs.extend([blob, array_to_blob(numpy.zeros(2))])
    (tmp_path / "w.caffemodel").write_bytes(param.SerializeToString())
    with pytest.raises(LayerforgeError, match=r"blob 0 has shape \(1, 2, 2, 12\) in the file but \(2, 12\)"):
        tiny_net().copy_from(str(tmp_path / "w.caffemodel"))


V1_PROTOTXT = """name: "v1net"
input: "data"
input_dim: 2 input_dim: 3 input_dim: 1 input_dim: 1
layers { name: "fc" type: INNER_PRODUCT bottom: "data" top: "fc" inner_product_param { num_output: 2 } }
layers { name: "relu" type: RELU bottom: "fc" top: "fc" }
"""


def test_v1_net_with_weights_loads(tmp_path):
    (tmp_path / "v1.prototxt").write_text(V1_PROTOTXT)
    net = Net(str(tmp_path / "v1.prototxt"), phase="test")
    param = caffe_pb.NetParameter(name="v1net")
    fc = param.layers.add(name="fc", type=caffe_pb.V1LayerParameter.INNER_PRODUCT)
    fc.bottom.append("data")
    fc.top.append("fc")
    w = numpy.array([[1, -2, 3], [0.5, 0.25, -1]], numpy.float32)
    array_to_blob(w.reshape(1, 1, 2, 3), fc.blobs.add(), legacy=True)
    array_to_blob(numpy.array([0.5, -10], numpy.float32).reshape(1, 1, 1, 2), fc.blobs.add(), legacy=True)
    (tmp_path / "v1.caffemodel").write_bytes(param.SerializeToString())
    net = Net(str(tmp_path / "v1.prototxt"), phase="test", weights=str(tmp_path / "v1.caffemodel"))
    out = net.forward(data=numpy.array([[1, 2, 3], [0, 0, 1]], numpy.float32).reshape(2, 3, 1, 1))["fc"]
    numpy.testing.assert_allclose(out, [[6.5, 0], [3.5, 0]])  # x W^T + b, then ReLU


def test_v0_layers_inside_v1_entries_load(tmp_path):
    param = caffe_pb.NetParameter(name="v0")
    v0 = param.layers.add().layer
    v0.name, v0.type = "ip", "innerproduct"
    w = numpy.arange(24, dtype=numpy.float32).reshape(2, 12)
    array_to_blob(w, v0.blobs.add(), legacy=True)
    array_to_blob(numpy.array([1, 2], numpy.float32), v0.blobs.add(), legacy=True)
    (tmp_path / "v0.caffemodel").write_bytes(param.SerializeToString())
    net = tiny_net()
    net.copy_from(str(tmp_path / "v0.caffemodel"))
    numpy.testing.assert_array_equal(net.params["ip"][0].data, w)
    numpy.testing.assert_array_equal(net.params["ip"][1].data, [1, 2])


def test_prototxt_snippet_converts_and_loads_caffemodel(tmp_path):
    v2 = V1_PROTOTXT.replace("layers", "layer").replace("INNER_PRODUCT", '"InnerProduct"').replace("RELU", '"ReLU"')
    (tmp_path / "v2.prototxt").write_text(v2)
    kind, mapping, notes = convert_file(str(tmp_path / "v2.prototxt"))
    assert kind == "net" and [lp["type"] for lp in mapping["layers"]] == ["InnerProduct", "ReLU"]
    net = Net(mapping, phase="test")
    save_caffemodel(net, tmp_path / "v2.caffemodel")
    again = Net(mapping, phase="test", weights=str(tmp_path / "v2.caffemodel"))
    numpy.testing.assert_array_equal(again.params["fc"][0].data, net.params["fc"][0].data)


# ------------------------------------------------------------------------------------------
# bad files

@pytest.mark.parametrize("content, expected", [
    (None, "cannot read Caffe weights file"),
    (b"", "it holds no layers"),
    (b"\xff\xfe garbage \x00\x01\x02", "not a Caffe weights file (.caffemodel) (binary caffe.NetParameter"),
    ("truncated", "not a Caffe weights file (.caffemodel) (binary caffe.NetParameter"),
])
def test_bad_files_are_one_line_naming_the_path(tmp_path, content, expected):
    path = tmp_path / "w.caffemodel"
    if content == "truncated":
        save_caffemodel(tiny_net(), path)
        path.write_bytes(path.read_bytes()[:-7])
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(LayerforgeError) as e:
        tiny_net().copy_from(str(path))
    assert str(e.value).startswith(f"{path}: ") and expected in str(e.value) and "\n" not in str(e.value)


def test_values_that_do_not_fill_the_shape_are_refused():
    blob = caffe_pb.BlobProto()
    blob.shape.dim.extend([2, 3])
    blob.data.extend([1.0] * 5)
    with pytest.raises(LayerforgeError, match=r"w: holds 5 values for shape \(2, 3\) \(6\); truncated or corrupt"):
        blob_to_array(blob, "w")


# ------------------------------------------------------------------------------------------
# HDF5 weights (Net::ToHDF5)

def test_hdf5_weights_layout_and_round_trip(tmp_path):
    net = tiny_net(share=True)
    save_hdf5(net, tmp_path / "w.caffemodel.h5")
    with h5py.File(tmp_path / "w.caffemodel.h5", "r") as h5:
        assert sorted(h5) == ["data"]
        assert list(h5["data"]) == sorted(["x", "conv", "ip", "ip2", "c_conv_0_split"])
        assert sorted(h5["data/conv"]) == ["0", "1"] and sorted(h5["data/ip2"]) == ["1"]  # shared weight once
        numpy.testing.assert_array_equal(h5["data/ip/0"][()], net.params["ip"][0].data)
        assert h5["data/conv/0"].dtype == numpy.float32
    other = tiny_net(share=True)
    assert copy_trained_layers(other, tmp_path / "w.caffemodel.h5") == ["conv", "ip", "ip2"]  # parameters only
    for key, value in params_of(net).items():
        numpy.testing.assert_array_equal(params_of(other)[key], value)


# ------------------------------------------------------------------------------------------
# commands

def run_command(module, argv):
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv))


def test_convert_weights_both_ways(tmp_path):
    import yaml
    net = tiny_net()
    (tmp_path / "net.yaml").write_text(yaml.safe_dump({"name": "tiny", "layers": [
        {"name": "x", "type": "Input", "top": ["x"], "input": {"shape": [2, 1, 4, 4]}},
        {"name": "conv", "type": "Convolution", "bottom": "x", "top": "c", "convolution": {"num_output": 3,
                                                                                        "kernel_size": 3}},
        {"name": "ip", "type": "InnerProduct", "bottom": "c", "top": "y", "inner_product": {"num_output": 2}}]}))
    save_caffemodel(net, tmp_path / "w.caffemodel")
    assert run_command(convert_command, [str(tmp_path / "w.caffemodel"), "-o", str(tmp_path / "w.npz")]) == 0
    arrays = numpy.load(tmp_path / "w.npz")
    assert sorted(arrays.files) == ["conv/0", "conv/1", "ip/0", "ip/1"]
    numpy.testing.assert_array_equal(arrays["ip/0"], net.params["ip"][0].data)
    assert run_command(convert_command, [str(tmp_path / "w.npz"), "--model", str(tmp_path / "net.yaml"),
                                         "--phase", "test", "-o", str(tmp_path / "back.caffemodel")]) == 0
    back = caffe_pb.NetParameter.FromString((tmp_path / "back.caffemodel").read_bytes())
    numpy.testing.assert_array_equal(blob_to_array(back.layer[1].blobs[0]), net.params["conv"][0].data)
    with pytest.raises(LayerforgeError, match="needs --model NET"):
        run_command(convert_command, [str(tmp_path / "w.npz"), "-o", str(tmp_path / "x.caffemodel")])
    save_hdf5(net, tmp_path / "w.caffemodel.h5")
    assert run_command(convert_command, [str(tmp_path / "w.caffemodel.h5"), "-o", str(tmp_path / "h.npz")]) == 0
    from_h5 = numpy.load(tmp_path / "h.npz")
    assert sorted(from_h5.files) == sorted(arrays.files)
    numpy.testing.assert_array_equal(from_h5["conv/1"], arrays["conv/1"])


def test_test_and_time_commands_take_a_caffemodel(tmp_path, capsys):
    from layerforge.commands import test as test_command
    from layerforge.commands import time as time_command
    net = Net("configs/lenet.yaml", phase="test")
    save_caffemodel(net, tmp_path / "lenet.caffemodel")
    assert run_command(test_command, ["--model", "configs/lenet.yaml", "--weights", str(tmp_path / "lenet.caffemodel"),
                                      "--iterations", "1"]) == 0
    scored = Net("configs/lenet.yaml", phase="test", weights=str(tmp_path / "lenet.caffemodel"))
    scored.forward()  # the first TEST batch, as the command's single iteration
    assert f"] loss = {scored.loss:.6g} (* 1 = " in capsys.readouterr().err
    assert run_command(time_command, ["--model", "configs/lenet.yaml", "--weights", str(tmp_path / "lenet.caffemodel"),
                                      "--iterations", "1", "--batch", "2", "--json"]) == 0
