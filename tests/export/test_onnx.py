"""ONNX export checked by onnxruntime against layerforge's own forward (random weights, TEST phase)."""
import pathlib

import numpy
import pytest

from layerforge import Net
from layerforge.errors import ConfigError
from layerforge.net.netdef import load_net_def, set_batch_size

ort = pytest.importorskip("onnxruntime")
from layerforge.export.onnx import export_onnx  # noqa: E402  (needs onnx, which the onnx extra brings)

ROOT = pathlib.Path(__file__).resolve().parents[2]
ZOO = ["lenet.yaml", "cifar10_quick_net.yaml", "cifar10_full_net.yaml", "alexnet_net.yaml", "googlenet_net.yaml",
       "vgg16_net.yaml", "resnet50_net.yaml"]


def randomize_running_stats(net, rs):
    """BatchNorm's running sums, non-trivial: random means, positive variances, a scale factor != 1."""
    for layer in net.layers:
        if layer.type == "BatchNorm":
            c = layer.blobs[0].count
            layer.blobs[0].data[...] = rs.randn(c) * 2.5
            layer.blobs[1].data[...] = (rs.rand(c) + 0.5) * 2.5
            layer.blobs[2].data[...] = 2.5


def run_both(net, tmp_path, inputs=None):
    """(layerforge's outputs, onnxruntime's outputs) by output value name."""
    path = tmp_path / "net.onnx"
    model = export_onnx(net, str(path))
    for name, value in (inputs or {}).items():
        net.blobs[name].data[...] = value
    net.forward()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: net.blobs[i.name].data for i in session.get_inputs()}
    got = session.run(None, feeds)
    names = [o.name for o in session.get_outputs()]
    assert names == [o.name for o in model.graph.output]
    want = {}
    for name in names:
        blob = name.split("__")[0]
        want[name] = net.blobs[blob].data.copy()
    return want, dict(zip(names, got))


def assert_close(want, got, rtol=1e-4):
    assert want.keys() == got.keys() and want
    for name in want:
        scale = max(float(numpy.abs(want[name]).max()), 1e-12)
        assert got[name].shape == want[name].shape, name
        assert float(numpy.abs(got[name] - want[name]).max()) <= rtol * scale, name


@pytest.mark.parametrize("name", ZOO)
def test_zoo_net_matches_onnxruntime(tmp_path, name):
    netdef = load_net_def(str(ROOT / "configs" / name))
    set_batch_size(netdef, 2 if name in ("lenet.yaml", "cifar10_quick_net.yaml", "cifar10_full_net.yaml") else 1)
    net = Net(netdef, phase="test")
    randomize_running_stats(net, numpy.random.RandomState(0))
    want, got = run_both(net, tmp_path)
    assert_close(want, got)
    assert len(got) == 1  # the classifier's scores: losses and accuracies are left out


LAYERS = {
    "pool_ceil_one_axis_pad": [
        {"name": "p1", "type": "Pooling", "bottom": "x", "top": "p1",
         "pooling": {"pool": "MAX", "kernel_size": 3, "stride": 2, "pad_h": 1, "pad_w": 0}},
        {"name": "p2", "type": "Pooling", "bottom": "x", "top": "p2",
         "pooling": {"pool": "AVE", "kernel_size": 3, "stride": 2, "pad": 1}},
        {"name": "p3", "type": "Pooling", "bottom": "x", "top": "p3", "pooling": {"pool": "AVE", "global_pooling": True}},
    ],
    "lrn_both_regions": [
        {"name": "a", "type": "LRN", "bottom": "x", "top": "a", "lrn": {"local_size": 3, "alpha": 0.5, "beta": 0.75, "k": 2}},
        {"name": "w", "type": "LRN", "bottom": "x", "top": "w",
         "lrn": {"local_size": 3, "alpha": 0.5, "beta": 0.75, "norm_region": "WITHIN_CHANNEL"}},
    ],
    "eltwise_scale_slice_concat": [
        {"name": "s", "type": "Slice", "bottom": "x", "top": ["s1", "s2"], "slice": {"axis": 1, "slice_point": [1]}},
        {"name": "e1", "type": "Eltwise", "bottom": ["s2", "s2", "s2"], "top": "e1", "eltwise": {"operation": "PROD"}},
        {"name": "e2", "type": "Eltwise", "bottom": ["s2", "e1"], "top": "e2",
         "eltwise": {"operation": "SUM", "coeff": [0.5, -2]}},
        {"name": "e3", "type": "Eltwise", "bottom": ["s2", "e2"], "top": "e3", "eltwise": {"operation": "MAX"}},
        {"name": "sc", "type": "Scale", "bottom": "e3", "top": "e3", "scale": {"bias_term": True,
         "filler": {"type": "gaussian"}, "bias_filler": {"type": "gaussian"}}},
        {"name": "w", "type": "InnerProduct", "bottom": "x", "top": "w", "inner_product": {"num_output": 4,
         "weight_filler": {"type": "gaussian", "std": 0.1}}},
        {"name": "sc2", "type": "Scale", "bottom": ["x", "w"], "top": "sc2", "scale": {"axis": 0}},
        {"name": "c", "type": "Concat", "bottom": ["e3", "s1", "sc2"], "top": "c", "concat": {"axis": 1}},
    ],
    "neurons_and_fc": [
        {"name": "r", "type": "ReLU", "bottom": "x", "top": "r", "relu": {"negative_slope": 0.1}},
        {"name": "pr", "type": "PReLU", "bottom": "r", "top": "r", "prelu": {"filler": {"type": "gaussian"}}},
        {"name": "el", "type": "ELU", "bottom": "r", "top": "el", "elu": {"alpha": 0.7}},
        {"name": "sg", "type": "Sigmoid", "bottom": "el", "top": "sg"},
        {"name": "th", "type": "TanH", "bottom": "sg", "top": "th"},
        {"name": "dr", "type": "Dropout", "bottom": "th", "top": "th"},
        {"name": "fc", "type": "InnerProduct", "bottom": "th", "top": "fc", "inner_product": {"num_output": 5,
         "axis": 2, "weight_filler": {"type": "gaussian"}, "bias_filler": {"type": "gaussian"}}},
        {"name": "fl", "type": "Flatten", "bottom": "fc", "top": "fl"},
        {"name": "sm", "type": "Softmax", "bottom": "fl", "top": "sm"},
        {"name": "rs", "type": "Reshape", "bottom": "x", "top": "rs", "reshape": {"shape": {"dim": [0, -1, 4]}}},
        {"name": "bn", "type": "BatchNorm", "bottom": "x", "top": "bn"},
        {"name": "conv", "type": "Convolution", "bottom": "bn", "top": "conv", "convolution": {"num_output": 4,
         "kernel_size": 3, "pad": [1, 0], "stride": 2, "dilation": 2, "group": 2, "weight_filler": {"type": "gaussian"},
         "bias_filler": {"type": "gaussian"}}},
        {"name": "up", "type": "Deconvolution", "bottom": "conv", "top": "up", "convolution": {"num_output": 6,
         "kernel_size": 3, "pad": 1, "stride": 2, "group": 2, "weight_filler": {"type": "gaussian"},
         "bias_filler": {"type": "gaussian"}}},
    ],
    "dropout_of_the_forks": [  # Fast R-CNN's: TEST multiplies by 1 - p
        {"name": "d1", "type": "Dropout", "bottom": "x", "top": "d1", "dropout": {"dropout_ratio": 0.3,
         "scale_train": False}},
        {"name": "d2", "type": "Dropout", "bottom": "d1", "top": "d2", "dropout": {"dropout_ratio": 0.5}},
    ],
    "three_d": [
        {"name": "r", "type": "Reshape", "bottom": "x", "top": "v", "reshape": {"shape": {"dim": [2, 2, 2, 9, 8]}}},
        {"name": "c3", "type": "Convolution", "bottom": "v", "top": "c3", "convolution": {"num_output": 3,
         "kernel_size": [2, 3, 3], "pad": [0, 1, 1], "stride": [1, 2, 1], "weight_filler": {"type": "gaussian"}}},
        {"name": "d3", "type": "Deconvolution", "bottom": "c3", "top": "d3", "convolution": {"num_output": 2,
         "kernel_size": 2, "stride": 2, "weight_filler": {"type": "gaussian"}}},
    ],
}


# onnxruntime's CPU kernels for LRN, Elu, AveragePool... are float32 only: float64 runs where it has them
@pytest.mark.parametrize("case,dtype", [(c, "float32") for c in sorted(LAYERS)]
                         + [("eltwise_scale_slice_concat", "float64")])
def test_layer_mappings_match_onnxruntime(tmp_path, case, dtype):
    rs = numpy.random.RandomState(1)
    layers = [{"name": "input", "type": "Input", "top": "x", "input": {"shape": [[2, 4, 9, 8]]}}] + LAYERS[case]
    net = Net({"name": case, "layers": layers}, phase="test", dtype=dtype)
    randomize_running_stats(net, rs)
    want, got = run_both(net, tmp_path, {"x": rs.randn(2, 4, 9, 8)})
    assert_close(want, got, 1e-4 if dtype == "float32" else 1e-10)


@pytest.mark.parametrize("scale_train", [True, False])
def test_monte_carlo_dropout_samples_in_onnxruntime(tmp_path, scale_train):
    """The SegNet fork's sample_weights_test: ONNX's Dropout in training mode drops about p of the values and
    scales the rest as layerforge does (by 1 / (1 - p), or not at all with scale_train false)."""
    p = 0.4
    layers = [{"name": "input", "type": "Input", "top": "x", "input": {"shape": [[4, 50, 10, 10]]}},
              {"name": "d", "type": "Dropout", "bottom": "x", "top": "d",
               "dropout": {"dropout_ratio": p, "sample_weights_test": True, "scale_train": scale_train}}]
    net = Net({"name": "mc", "layers": layers}, phase="test")
    x = numpy.random.RandomState(3).uniform(1, 2, (4, 50, 10, 10)).astype(numpy.float32)
    want, got = run_both(net, tmp_path, {"x": x})
    scale = 1 / (1 - p) if scale_train else 1.0
    for y in (want["d"], got["d"]):
        kept = y != 0
        assert abs(kept.mean() - (1 - p)) < 5 * (p * (1 - p) / y.size) ** 0.5  # 5 sigma of 20,000 draws
        numpy.testing.assert_allclose(y[kept], x[kept] * scale, rtol=1e-6)
    assert (want["d"] != got["d"]).any()  # two independent samples


def test_unmapped_layer_type_is_one_line_naming_the_layer(tmp_path):
    from layerforge.layers import LAYER_REGISTRY, Layer, register_layer

    if "OnnxlessTestLayer" not in LAYER_REGISTRY:
        @register_layer("OnnxlessTestLayer")
        class OnnxlessTestLayer(Layer):
            def reshape(self, bottom, top):
                top[0].reshape(bottom[0].shape)

            def forward(self, bottom, top):
                top[0].data[...] = bottom[0].data

    net = Net({"name": "n", "layers": [
        {"name": "input", "type": "Input", "top": "x", "input": {"shape": [[1, 2]]}},
        {"name": "mine", "type": "OnnxlessTestLayer", "bottom": "x", "top": "y"}]}, phase="test")
    with pytest.raises(ConfigError, match=r"layer 'mine' \(OnnxlessTestLayer\): ONNX export has no mapping"):
        export_onnx(net, str(tmp_path / "n.onnx"))


def test_export_command_with_weights(tmp_path):
    from layerforge import cli

    net = Net(str(ROOT / "configs" / "cifar10_quick_net.yaml"), phase="test")
    net.params["conv1"][0].data[...] = 0.25
    net.save(str(tmp_path / "w.npz"))
    out = tmp_path / "c.onnx"
    assert cli.main(["export", str(ROOT / "configs" / "cifar10_quick_net.yaml"), "--weights", str(tmp_path / "w.npz"),
                     "--batch", "3", "-o", str(out)]) == 0
    import onnx

    model = onnx.load(str(out))
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    numpy.testing.assert_array_equal(weights["conv1_W"], 0.25)
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [3, 3, 32, 32]


def test_convolution_without_a_spatial_axis_is_refused(tmp_path):
    net = Net({"name": "n", "layers": [
        {"name": "input", "type": "Input", "top": "x", "input": {"shape": [[2, 4]]}},
        {"name": "mix", "type": "Convolution", "bottom": "x", "top": "y", "convolution": {"num_output": 3}}]},
        phase="test")
    with pytest.raises(ConfigError, match=r"layer 'mix' \(Convolution\).*needs a spatial axis"):
        export_onnx(net, str(tmp_path / "n.onnx"))
