"""Caffe prototxt -> layerforge YAML, on the real BVLC files in <repo>/../shared/caffe-models/.

Every file there converts. Each net builds in TRAIN and TEST and its definition equals the hand-written zoo
config layer by layer; its summary (learnable parameters, shapes, multiply-adds) equals the zoo config's.
The Caffe databases are not here, so for building, Data layers are replaced by Input layers of the shapes
their databases would give (MNIST 1x28x28, CIFAR-10 3x32x32, ImageNet 3x256x256 records, cropped as
``transform.crop_size`` says); LeNet is also built and run with its real Data layers on the bundled MNIST.
Zoo configs are compared in their Caffe stage ``real`` (their LMDB data layers), ignoring data sources
and mean-file paths.
"""
import math
import os
import pathlib
import re

import numpy
import pytest

from layerforge.solvers.caffe_import import convert_file, convert_message
from layerforge.yaml_text import to_yaml
from layerforge.caffe.prototxt import parse, parse_file
from layerforge.cli import main
from layerforge.commands.summary import summarize
from layerforge.errors import ConfigError
from layerforge.layers import LAYER_REGISTRY
from layerforge.net import Net
from layerforge.layers.layer_param import layer_included, parse_layer
from layerforge.net.netdef import NetParameter, load_net_def
from layerforge.schema import Params, load_yaml_text
from layerforge.solvers import SOLVER_REGISTRY, learning_rate, load_solver_param

ROOT = pathlib.Path(__file__).resolve().parents[2]
# the BVLC files beside the repository; LAYERFORGE_CAFFE_MODELS names another folder (a worktree's checkout)
MODELS = pathlib.Path(os.environ.get("LAYERFORGE_CAFFE_MODELS", ROOT.parent / "shared" / "caffe-models"))
FILES = sorted(p.name for p in MODELS.glob("*.prototxt")) if MODELS.is_dir() else []
needs_models = pytest.mark.skipif(not FILES, reason=f"the Caffe model files are not here ({MODELS})")

MNIST, CIFAR, IMAGENET = (1, 28, 28), (3, 32, 32), (3, 256, 256)
# prototxt -> (zoo net config or None, record shape of its database, learnable parameters of the Caffe net)
NETS = {
    "mnist__lenet_train_test.prototxt": ("configs/lenet.yaml", MNIST, 431_080),
    "mnist__lenet.prototxt": (None, MNIST, 431_080),
    "cifar10__cifar10_quick_train_test.prototxt": ("configs/cifar10_quick_net.yaml", CIFAR, 145_578),
    # 32*3*25+32 + 32*32*25+32 + 64*32*25+64 + 10*64*4*4+10
    "cifar10__cifar10_full_train_test.prototxt": ("configs/cifar10_full_net.yaml", CIFAR, 89_578),
    "bvlc_alexnet__train_val.prototxt": ("configs/alexnet_net.yaml", IMAGENET, 60_965_224),
    # the auxiliary classifiers run in both phases in bvlc_googlenet
    "bvlc_googlenet__train_val.prototxt": ("configs/googlenet_net.yaml", IMAGENET, 13_378_280),
}
# (prototxt, phase) -> (why the zoo config differs on purpose, the only differences allowed: a regex)
KNOWN_DIFFERENCES = {
    ("bvlc_googlenet__train_val.prototxt", "TEST"): (
        "configs/googlenet_net.yaml runs the auxiliary classifiers in TRAIN only; bvlc_googlenet also runs them "
        "(with their top-1/top-5 accuracies) in TEST",
        r"only in the Caffe file: loss[12]/\S+"),
}
SOLVERS = [f for f in FILES if "solver" in f]
DATA_TYPES = ("Data", "ImageData")
GEOMETRY = {"Convolution": ("convolution", ("kernel_size", "kernel", "stride", "pad", "dilation")),
            "Pooling": ("pooling", ("kernel_size", "kernel", "stride", "pad"))}


def model(name):
    return MODELS / name


def plain(value):
    """Validated Params (nested) -> plain dicts and lists, for comparison."""
    if isinstance(value, Params):
        return {k: plain(v) for k, v in value.as_dict().items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def layer_view(lp):
    view = {"type": lp.type, "bottom": lp.bottom, "top": lp.top, "param": plain(lp.param),
            "loss_weight": lp.loss_weight, "propagate_down": lp.propagate_down}
    for block in LAYER_REGISTRY[lp.type].param_blocks:
        view[block] = plain(getattr(lp, block))
    geometry = GEOMETRY.get(lp.type)
    if geometry:  # compare what the layer computes with: kernel_size: 3 == kernel_h: 3 + kernel_w: 3, pad [] == [0]
        block, keys = geometry
        for key in keys:
            for form in (key, f"{key}_h", f"{key}_w"):
                view[block].pop(form, None)
        view[block]["geometry"] = LAYER_REGISTRY[lp.type].read_geometry(lp)
    if lp.type in DATA_TYPES:  # where the data lives is the user's business, not the definition's
        block = view["data" if lp.type == "Data" else "image_data"]
        block.pop("source")
        # and so is the read order: converted Data layers read in Caffe's key order, the zoo's reshuffle in TRAIN
        block.pop("shuffle")
        view["transform"]["mean_file"] = view["transform"]["mean_file"] is not None
    return view


def phase_views(netdef, phase, stages=()):
    return {lp.name: layer_view(lp) for lp in netdef.layers if layer_included(lp, phase, 0, stages)}


def differences(converted, zoo):
    out = [f"only in the Caffe file: {n}" for n in converted if n not in zoo]
    out += [f"only in the zoo config: {n}" for n in zoo if n not in converted]
    for name in converted:
        if name in zoo and converted[name] != zoo[name]:
            keys = [k for k in converted[name] if converted[name][k] != zoo[name].get(k)]
            out += [f"{name}.{k}: {converted[name][k]!r} != {zoo[name].get(k)!r}" for k in keys]
    return out


def with_input_data(netdef, record_shape, batch=1):
    """The net with each Data/ImageData layer replaced by an Input layer of the shapes it would produce."""
    layers = []
    for lp in netdef.layers:
        if lp.type in DATA_TYPES:
            crop = lp.transform.crop_size
            shape = (record_shape[0], crop, crop) if crop else record_shape
            shapes = [[batch, *shape], [batch]][:len(lp.top)]
            new = parse_layer({"name": lp.name, "type": "Input", "top": lp.top, "input": {"shape": shapes}})
            new.include, new.exclude = lp.include, lp.exclude
            lp = new
        layers.append(lp)
    return NetParameter(netdef.name, layers, netdef.force_backward, netdef.path, netdef.state)


_BUILT = {}


def built(key, make):
    """Nets are cached per test session: AlexNet's 61M parameters take seconds to fill."""
    if key not in _BUILT:
        _BUILT[key] = make()
    return _BUILT[key]


def converted_net(name, phase):
    def make():
        _, mapping, _ = convert_file(model(name))
        return Net(with_input_data(load_net_def(mapping), NETS[name][1]), phase=phase)
    return built((name, phase), make)


def zoo_net(name, phase):
    path = ROOT / NETS[name][0]
    return built((str(path), phase), lambda: Net(with_input_data(load_net_def(str(path)), NETS[name][1]),
                                                 phase=phase, stages=("real",)))


ZOO_CASES = [(n, p) for n, (zoo, _, _) in NETS.items() if zoo for p in ("TRAIN", "TEST")]


# ------------------------------------------------------------------------------------------------
# the real files

def test_the_caffe_models_are_there():
    if not FILES:
        pytest.skip(f"the Caffe model files are not here ({MODELS})")
    nets = [f for f in FILES if f not in SOLVERS]
    assert sorted(nets) == sorted(NETS), "a new net file needs an entry in NETS"


@needs_models
@pytest.mark.parametrize("name", FILES)
def test_every_file_converts_and_its_yaml_reads_back(name):
    kind, mapping, notes = convert_file(model(name))
    assert kind == ("solver" if "solver" in name else "net")
    text = to_yaml(mapping, ["header"] + [f"note: {n}" for n in notes])
    assert load_yaml_text(text) == mapping
    assert all(len(line) <= 125 for line in text.splitlines())
    if kind == "net":
        caffe_layers = parse_file(model(name)).all("layer")
        assert [layer["name"] for layer in mapping["layers"]] == [m.value.get("name") for m in caffe_layers]
        assert [layer.line for layer in mapping["layers"]] == [m.line for m in caffe_layers]


@needs_models
@pytest.mark.parametrize("name", sorted(NETS))
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_each_net_builds_with_the_caffe_parameter_count(name, phase):
    net = converted_net(name, phase)
    assert net.num_learnable == NETS[name][2]
    assert summarize(net)[1] == NETS[name][2]


@needs_models
@pytest.mark.parametrize("name, phase", ZOO_CASES)
def test_converted_net_equals_the_zoo_config_layer_by_layer(name, phase):
    zoo_path = ROOT / NETS[name][0]
    if not zoo_path.exists():
        pytest.skip(f"{NETS[name][0]} is not written yet")
    _, mapping, _ = convert_file(model(name))
    converted = phase_views(load_net_def(mapping), phase)
    zoo = phase_views(load_net_def(str(zoo_path)), phase, stages=("real",))
    found = differences(converted, zoo)
    if (name, phase) in KNOWN_DIFFERENCES:
        reason, allowed = KNOWN_DIFFERENCES[name, phase]
        assert found, f"no differences left: remove the KNOWN_DIFFERENCES entry ({reason})"
        found = [d for d in found if not re.fullmatch(allowed, d)]
    assert found == []


@needs_models
@pytest.mark.parametrize("name, phase", [c for c in ZOO_CASES if c[1] == "TRAIN"])
def test_converted_summary_equals_the_zoo_summary(name, phase):
    if not (ROOT / NETS[name][0]).exists():
        pytest.skip(f"{NETS[name][0]} is not written yet")
    rows, params, macs = summarize(converted_net(name, phase))
    zoo_rows, zoo_params, zoo_macs = summarize(zoo_net(name, phase))
    assert (params, macs) == (zoo_params, zoo_macs)
    assert rows == zoo_rows


@needs_models
def test_lenet_runs_with_real_data_layers_on_the_bundled_mnist():
    _, mapping, _ = convert_file(model("mnist__lenet_train_test.prototxt"))
    for layer in mapping["layers"]:
        if layer["type"] == "Data":
            layer["data"]["source"] = layer["data"]["source"].replace("examples/", "data/")
    net = Net(mapping, phase="test")
    out = net.forward()
    assert net.blobs["data"].shape == (100, 1, 28, 28) and float(net.blobs["data"].data.max()) <= 1.0
    assert 0.0 <= float(out["accuracy"]) <= 1.0 and math.isfinite(float(out["loss"]))


@needs_models
def test_deploy_lenet_input_layer():
    _, mapping, notes = convert_file(model("mnist__lenet.prototxt"))
    assert mapping["layers"][0] == {"name": "data", "type": "Input", "top": "data", "input": {"shape": [64, 1, 28, 28]}}
    assert notes == []
    net = Net(mapping, phase="test")
    assert net.blobs["prob"].shape == (64, 10)


# ------------------------------------------------------------------------------------------------
# solvers

@needs_models
@pytest.mark.parametrize("name", SOLVERS)
def test_solver_values_are_the_caffe_values(name):
    msg = parse_file(model(name))
    _, mapping, notes = convert_file(model(name))
    for key in msg.names():
        values = msg.values(key)
        if key == "net":
            assert mapping["net"] == pathlib.PurePath(values[0]).stem + ".yaml"
            assert any(values[0] in n for n in notes)
        else:
            assert mapping[key] == (values[0] if len(values) == 1 and key not in ("stepvalue",) else values), key
    sp = load_solver_param(mapping, SOLVER_REGISTRY)
    assert sp.base_lr == msg.get("base_lr") and sp.lr_policy == msg.get("lr_policy").upper()


@needs_models
def test_solver_recipes_by_hand():
    def solver(name):
        return load_solver_param(convert_file(model(name))[1], SOLVER_REGISTRY)

    sp = solver("mnist__lenet_solver.prototxt")
    assert (sp.type, sp.base_lr, sp.lr_policy, sp.gamma, sp.power, sp.momentum, sp.weight_decay) == \
        ("SGD", 0.01, "INV", 0.0001, 0.75, 0.9, 0.0005)
    assert learning_rate(sp, 100) == pytest.approx(0.01 * (1 + 0.0001 * 100) ** -0.75)
    sp = solver("mnist__lenet_multistep_solver.prototxt")
    assert sp.stepvalue == [5000, 7000, 8000, 9000, 9500]
    assert learning_rate(sp, 7500) == pytest.approx(0.01 * 0.9 ** 2)
    sp = solver("mnist__lenet_solver_adam.prototxt")
    assert (sp.type, sp.base_lr, sp.momentum, sp.momentum2, sp.lr_policy) == ("Adam", 0.001, 0.9, 0.999, "FIXED")
    sp = solver("bvlc_alexnet__solver.prototxt")
    assert (sp.lr_policy, sp.gamma, sp.stepsize, sp.max_iter, sp.solver_mode) == ("STEP", 0.1, 100000, 450000, "GPU")
    assert learning_rate(sp, 250000) == pytest.approx(0.01 * 0.1 ** 2)
    sp = solver("bvlc_googlenet__solver.prototxt")
    assert (sp.test_initialization, sp.average_loss, sp.gamma, sp.weight_decay) == (False, 40, 0.96, 0.0002)
    sp = solver("cifar10__cifar10_quick_solver.prototxt")
    assert (sp.base_lr, sp.weight_decay, sp.max_iter, sp.test_iter) == (0.001, 0.004, 4000, [100])


@needs_models
def test_converted_lenet_solver_trains(tmp_path, capsys):
    from layerforge.solvers import get_solver
    assert main(["convert", str(model("mnist__lenet_solver.prototxt")), "-o", str(tmp_path / "solver.yaml")]) == 0
    assert main(["convert", str(model("mnist__lenet_train_test.prototxt")), "-o",
                 str(tmp_path / "lenet_train_test.yaml")]) == 0
    out, err = capsys.readouterr()
    assert "wrote" in out and "solver.yaml (solver)" in out and "(net 'LeNet', 11 layers)" in out
    assert "note: net: 'examples/mnist/lenet_train_test.prototxt' -> 'lenet_train_test.yaml'" in err
    net_yaml = tmp_path / "lenet_train_test.yaml"
    net_yaml.write_text(net_yaml.read_text().replace("examples/mnist/", "data/mnist/"))
    solver = get_solver(str(tmp_path / "solver.yaml"), max_iter=2, solver_mode="CPU", test_initialization=False,
                        snapshot=0, snapshot_after_train=False, display=0)
    solver.step(2)
    assert solver.iter == 2


# ------------------------------------------------------------------------------------------------
# mapping rules, on small nets written here

def convert_text(text, path="net.prototxt"):
    return convert_message(parse(text, path), path)


def layer_of(text):
    return convert_text(f'name: "n"\nlayer {{ name: "in" type: "Input" top: "x" input_param {{ shape {{ dim: 2 '
                        f'dim: 3 dim: 8 dim: 8 }} }} }}\n{text}')[1]["layers"][1]


def test_blocks_params_include_and_fillers():
    layer = layer_of('layer {\n name: "c" type: "Convolution" bottom: "x" top: "c"\n'
                     ' param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }\n'
                     ' include { phase: TRAIN } propagate_down: true loss_weight: 0\n'
                     ' convolution_param { num_output: 4 kernel_size: 3 kernel_size: 1 pad: 1 group: 1\n'
                     '  weight_filler { type: "gaussian" std: 0.01 } bias_filler { type: "constant" value: 0.1 }\n'
                     '  engine: CAFFE axis: 1 } }')
    assert layer == {"name": "c", "type": "Convolution", "bottom": "x", "top": "c", "include": {"phase": "TRAIN"},
                     "param": [{"lr_mult": 1, "decay_mult": 1}, {"lr_mult": 2, "decay_mult": 0}],
                     "loss_weight": 0, "propagate_down": True,
                     "convolution": {"num_output": 4, "kernel_size": [3, 1], "pad": 1, "group": 1, "axis": 1,
                                     "weight_filler": {"type": "gaussian", "std": 0.01},
                                     "bias_filler": {"type": "constant", "value": 0.1}}}
    assert layer.line == 3 and layer.key_lines["convolution"] == 7


def test_engine_only_blocks_and_default_only_fields_are_dropped():
    layer = layer_of('layer { name: "s" type: "Sigmoid" bottom: "x" top: "x" sigmoid_param { engine: CUDNN } }')
    assert layer == {"name": "s", "type": "Sigmoid", "bottom": "x", "top": "x"}
    layer = layer_of('layer { name: "d" type: "Dropout" bottom: "x" top: "x" '
                     'dropout_param { dropout_ratio: 0.3 scale_train: false } }')  # Fast R-CNN's field
    assert layer["dropout"] == {"dropout_ratio": 0.3, "scale_train": False}


def test_shapes_and_multiple_tops():
    net = convert_text('layer { name: "d" type: "DummyData" top: "a" top: "b"\n'
                       ' dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 2 }\n'
                       '  data_filler { type: "gaussian" } data_filler { type: "constant" value: 1 } } }\n'
                       'layer { name: "r" type: "Reshape" bottom: "a" top: "r"\n'
                       ' reshape_param { shape { dim: 0 dim: -1 } } }')[1]
    assert net["layers"][0]["dummy_data"] == {"shape": [[2, 3], [2]],
                                              "data_filler": [{"type": "gaussian"}, {"type": "constant", "value": 1}]}
    assert net["layers"][1]["reshape"] == {"shape": [0, -1]}
    assert Net(net, phase="test").blobs["r"].shape == (2, 3)


@pytest.mark.parametrize("inputs", [
    'input: "data"\ninput_shape { dim: 1 dim: 3 dim: 8 dim: 8 }\n',
    'input: "data"\ninput_dim: 1\ninput_dim: 3\ninput_dim: 8\ninput_dim: 8\n',
])
def test_net_level_inputs(inputs):
    kind, net, _ = convert_text(f'name: "in"\n{inputs}force_backward: true\n'
                                'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                                'inner_product_param { num_output: 5 } }')
    assert kind == "net" and net["input"] == ["data"] and net["force_backward"] is True
    built_net = Net(net, phase="test")
    assert built_net.blobs["data"].shape == (1, 3, 8, 8) and built_net.blobs["ip"].shape == (1, 5)


def test_old_data_param_fields_move_to_transform():
    net = convert_text('layer { name: "d" type: "Data" top: "data" top: "label"\n'
                       ' data_param { source: "db" batch_size: 4 scale: 0.5 mirror: true crop_size: 3 } }')[1]
    layer = net["layers"][0]
    assert layer["transform"] == {"scale": 0.5, "mirror": True, "crop_size": 3}
    assert layer["data"] == {"source": "db", "batch_size": 4, "shuffle": False}  # Caffe reads in key order
    assert list(layer)[-2:] == ["transform", "data"]
    for order in ('transform_param { scale: 2 }\n data_param { source: "db" batch_size: 4 scale: 0.5 }',
                  'data_param { source: "db" batch_size: 4 scale: 0.5 }\n transform_param { scale: 2 }'):
        with pytest.raises(ConfigError, match=r"net.prototxt:\d: .*'scale' is given in both data_param and trans"):
            convert_text(f'layer {{ name: "d" type: "Data" top: "data"\n {order} }}')
    net = convert_text('layer { name: "d" type: "Data" top: "data"\n data_param { source: "db" batch_size: 4 '
                       'mirror: true }\n transform_param { scale: 2 } }')[1]
    assert net["layers"][0]["transform"] == {"scale": 2, "mirror": True}


V1_LENET = """
name: "LeNet"
layers {
  name: "mnist"  type: DATA  top: "data"  top: "label"
  data_param { source: "examples/mnist/mnist_train_lmdb" backend: LMDB batch_size: 64 }
  transform_param { scale: 0.00390625 }
  include: { phase: TRAIN }
}
layers {
  name: "mnist"  type: DATA  top: "data"  top: "label"
  data_param { source: "examples/mnist/mnist_test_lmdb" backend: LMDB batch_size: 100 }
  transform_param { scale: 0.00390625 }
  include: { phase: TEST }
}
layers {
  name: "conv1"  type: CONVOLUTION  bottom: "data"  top: "conv1"
  blobs_lr: 1  blobs_lr: 2
  convolution_param { num_output: 20 kernel_size: 5 stride: 1
    weight_filler { type: "xavier" } bias_filler { type: "constant" } }
}
layers { name: "pool1" type: POOLING bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers {
  name: "conv2"  type: CONVOLUTION  bottom: "pool1"  top: "conv2"
  blobs_lr: 1  blobs_lr: 2
  convolution_param { num_output: 50 kernel_size: 5 stride: 1
    weight_filler { type: "xavier" } bias_filler { type: "constant" } }
}
layers { name: "pool2" type: POOLING bottom: "conv2" top: "pool2"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers { name: "ip1" type: INNER_PRODUCT bottom: "pool2" top: "ip1" blobs_lr: 1 blobs_lr: 2
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layers { name: "relu1" type: RELU bottom: "ip1" top: "ip1" }
layers { name: "ip2" type: INNER_PRODUCT bottom: "ip1" top: "ip2" blobs_lr: 1 blobs_lr: 2
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layers { name: "accuracy" type: ACCURACY bottom: "ip2" bottom: "label" top: "accuracy" include: { phase: TEST } }
layers { name: "loss" type: SOFTMAX_LOSS bottom: "ip2" bottom: "label" top: "loss" }
"""


@needs_models
def test_v1_layers_convert_like_the_current_format():
    v1 = load_net_def(convert_text(V1_LENET)[1])
    current = load_net_def(convert_file(model("mnist__lenet_train_test.prototxt"))[1])
    for phase in ("TRAIN", "TEST"):
        assert phase_views(v1, phase) == phase_views(current, phase)


def test_v1_blobs_lr_weight_decay_and_param_names():
    net = convert_text('layers { name: "in" type: DUMMY_DATA top: "x" dummy_data_param { shape { dim: 2 dim: 3 } } }\n'
                       'layers { name: "a" type: INNER_PRODUCT bottom: "x" top: "a" param: "w" param: "b"\n'
                       ' blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0\n'
                       ' inner_product_param { num_output: 2 } }\n'
                       'layers { name: "b" type: INNER_PRODUCT bottom: "x" top: "b" param: "w" param: "b"\n'
                       ' inner_product_param { num_output: 2 } }')[1]
    assert net["layers"][1]["param"] == [{"name": "w", "lr_mult": 1, "decay_mult": 1},
                                         {"name": "b", "lr_mult": 2, "decay_mult": 0}]
    assert net["layers"][2]["param"] == [{"name": "w"}, {"name": "b"}]
    assert convert_text('layers { name: "r" type: 18 bottom: "x" top: "x" }\n'
                        'layers { name: "in" type: DUMMY_DATA top: "x" dummy_data_param { shape { dim: 1 } } }'
                        )[1]["layers"][0]["type"] == "ReLU"  # V1 enums by number too
    built_net = Net(net, phase="train")
    assert built_net.params["a"][0] is built_net.params["b"][0] or \
        built_net.params["a"][0].data is built_net.params["b"][0].data


# ------------------------------------------------------------------------------------------------
# errors: one line, file:line, the layer and the Caffe field

@pytest.mark.parametrize("text, line, fragment", [
    ('layer {\n name: "p"\n type: "Frobnicate"\n}', 3,
     "layer 'p' (Frobnicate): key 'type': unsupported layer type 'Frobnicate'"),
    ('layers {\n name: "h"\n type: HDF5_DATA\n}', 1, "layer 'h' (HDF5Data): key 'hdf5_data.source': required key is missing"),
    ('layers { name: "h" type: BOGUS }', 1, "unknown V1 layer type BOGUS"),
    ('layer { name: "c" type: "Convolution" bottom: "x" top: "c"\n convolution_param { num_output: 2\n'
     '  kernel_size: 1\n  frobnicate: 3 } }', 4, "key 'convolution_param.frobnicate': Caffe field 'frobnicate' has "
                                                 "no layerforge equivalent"),
    ('layer { name: "l" type: "SigmoidCrossEntropyLoss" bottom: "x" bottom: "y" top: "l"\n loss_param {\n'
     '  class_weighting: 0.5 } }', 3, "Caffe field 'class_weighting' (a field of alexgkendall/caffe-segnet (SegNet) "
                                      "and TimoSaemann/caffe-enet (ENet)) has no layerforge equivalent"),
    ('layer { name: "d" type: "Data" top: "d"\n data_param { source: "x" batch_size: 2 backend: LMDB }\n'
     ' transform_param {\n  distort_param { brightness_prob: 0.5 } } }', 4,  # the fork distorts AnnotatedData's only
     "key 'transform_param.distort_param': Caffe field 'distort_param' (a field of weiliu89/caffe (branch ssd: SSD)) "
     "has no layerforge equivalent"),
    ('layer { name: "b" type: "BatchNorm" bottom: "x" top: "x"\n batch_norm_param {\n'
     '  scale_bias: true } }', 3, "Caffe field 'scale_bias' (a field of OpenCV's caffe.proto (opencv/opencv, "
                                  "modules/dnn)) has no layerforge equivalent"),
    ('layer { name: "c" type: "Convolution" bottom: "x" top: "c"\n convolution_param { num_output: 2 kernel_size: 1\n'
     '  weight_filler { type: "xavier"\n   foo: 1 } } }', 4, "key 'convolution_param.weight_filler.foo'"),
    ('layer { name: "r" type: "ReLU" bottom: "x" top: "x"\n pooling_param { pool: MAX } }', 2,
     "key 'pooling_param': 'pooling_param' does not apply to ReLU layers"),
    ('layer { name: "r" type: "ReLU" bottom: "x" top: "x"\n phase: TRAIN }', 2,
     "key 'phase': Caffe field 'phase' has no layerforge equivalent"),
    ('layer { name: "r" type: "ReLU" bottom: "x" top: "x"\n blobs { data: 1 } }', 2, "weights inside a net"),
    ('layer { name: "r" type: "ReLU" bottom: "x" top: "x"\n param { lr_mult: 1 share_mode: PERMISSIVE } }', 2,
     "key 'param.share_mode': Caffe field 'share_mode' is supported only with its default 'STRICT'"),
    ('layer { name: "c" type: "InnerProduct" bottom: "x" top: "c"\n inner_product_param { num_output: 2\n'
     '  num_output: 3 } }', 3, "key 'inner_product_param.num_output': non-repeated field given 2 times"),
    ('layer { name: "n" type: "LRN" bottom: "x" top: "n"\n lrn_param {\n  norm_region: SIDEWAYS } }', 3,
     "key 'lrn.norm_region': expected one of ACROSS_CHANNELS, WITHIN_CHANNEL"),
    ('layer { name: "d" type: "Dropout" bottom: "x" top: "x"\n dropout_param { dropout_ratio: "half" } }', 2,
     "key 'dropout.dropout_ratio': expected a number"),
    ('layer { name: "d" type: "Data" top: "d"\n data_param { source: "x" batch_size: 2\n backend: LEVELDB } }', 3,
     "key 'data.backend': expected one of LMDB"),
    ('layer { name: "c" type: "InnerProduct" bottom: "x" top: "c"\n inner_product_param { num_output { a: 1 } } }', 2,
     "Caffe field 'num_output' cannot be a message"),
    ('layer { name: "c" type: "InnerProduct" bottom: "x" top: "c"\n inner_product_param { weight_filler: 3 } }', 2,
     "Caffe field 'weight_filler' cannot be the value 3"),
    ('name: "x"\nlayer { name: "a" type: "ReLU" bottom: "x" top: "x" }\nlayers { name: "b" type: RELU }', 3,
     "give 'layer' (current) or 'layers' (V1) entries, not both"),
    ('name: "x"\nprofile: true\nlayer { name: "a" type: "ReLU" bottom: "x" top: "x" }', 2,
     "key 'profile': Caffe field 'profile' has no layerforge equivalent"),
    ('layers {\n layer { name: "old" } }', 2, "V0 layer definitions"),
    ('layer {\n name: "r"\n bottom: "x" }', 1, "layer 'r': key 'type': layer has no 'type'"),
])
def test_errors_name_the_field_and_its_line(text, line, fragment):
    with pytest.raises(ConfigError) as info:
        convert_text(text)
    message = str(info.value)
    assert message.startswith(f"net.prototxt:{line}: "), message
    assert fragment in message
    assert "\n" not in message


def test_every_layer_type_of_the_forks_is_registered():
    from layerforge.caffe import caffe_pb
    from layerforge.layers import LAYER_REGISTRY
    assert {t for types in caffe_pb.FORK_LAYER_TYPES.values() for t in types} <= set(LAYER_REGISTRY)


def test_a_fork_layer_type_layerforge_lacks_is_named_with_its_fork(monkeypatch):
    from layerforge.caffe import caffe_pb
    monkeypatch.setitem(caffe_pb.FORK_LAYER_TYPES, "ssd", caffe_pb.FORK_LAYER_TYPES["ssd"] + ("Unpool",))
    with pytest.raises(ConfigError, match=re.escape("layer 'u' (Unpool): key 'type': unsupported layer type 'Unpool' (a "
                                                    "layer of weiliu89/caffe (branch ssd: SSD) that layerforge lacks)")):
        convert_text('layer {\n name: "u"\n type: "Unpool"\n}')


def test_graph_errors_keep_prototxt_lines():
    with pytest.raises(ConfigError, match=r"^net.prototxt:3: layer 'r' \(ReLU\): key 'propagate_down': has 2 entries"):
        convert_text('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }\n'
                     'layer { name: "r" type: "ReLU" bottom: "x" top: "y"\n'
                     ' propagate_down: true propagate_down: false }')


def test_cannot_tell_net_from_solver():
    with pytest.raises(ConfigError, match="cannot tell whether"):
        convert_text('name: "just a name"')


# ------------------------------------------------------------------------------------------------
# solvers written here

def solver_of(text):
    return convert_text(text, "solver.prototxt")


def test_solver_type_enum_states_and_inline_nets():
    kind, sp, notes = solver_of('net_param { name: "inline"\n layer { name: "in" type: "Input" top: "x"\n'
                                '  input_param { shape { dim: 1 dim: 2 } } } }\n'
                                'solver_type: NESTEROV\nbase_lr: 0.1\nlr_policy: "poly"\npower: 2\nmax_iter: 10\n'
                                'train_state { phase: TRAIN stage: "a" }\ntest_state { stage: "b" level: 2 }\n'
                                'test_iter: 5\nsnapshot_format: HDF5\ndebug_info: true\n')
    assert kind == "solver"
    assert sp["type"] == "Nesterov" and sp["net_param"]["layers"][0]["input"] == {"shape": [1, 2]}
    assert sp["train_state"] == {"stage": "a"} and sp["test_state"] == [{"stage": "b", "level": 2}]
    assert sp["snapshot_format"] == "HDF5" and "debug_info" not in sp  # snapshot_format is supported
    param = load_solver_param(sp, SOLVER_REGISTRY)
    assert param.type == "Nesterov" and learning_rate(param, 5) == pytest.approx(0.1 * 0.5 ** 2)


def test_solver_without_base_lr_gets_caffes_default_zero():
    _, sp, notes = solver_of('net: "a/b.prototxt"\nlr_policy: "fixed"\n')
    assert sp["base_lr"] == 0.0 and sp["net"] == "b.yaml"
    assert any("base_lr" in n for n in notes)


@pytest.mark.parametrize("text, line, fragment", [
    ('net: "a"\nbase_lr: 0.1\nlr_policy: "fixed"\nfancy_option: 3\n', 4,
     "key 'fancy_option': Caffe field 'fancy_option' has no layerforge equivalent"),
    ('net: "a"\nbase_lr: 0.1\nlr_policy: "step"\ngamma: 0.1\n', 3, "lr_policy step needs 'stepsize'"),
    ('net: "a"\nbase_lr: 0.1\nlr_policy: "sometimes"\n', 3, "key 'lr_policy': expected one of"),
    ('net: "a"\nsolver_type: ADAM\ntype: "Adam"\n', 2, "not both"),
    ('net: "a"\ntest_state { phase: TRAIN }\n', 2, "a test net's phase is TEST"),
])
def test_solver_errors(text, line, fragment):
    with pytest.raises(ConfigError) as info:
        solver_of(text)
    assert str(info.value).startswith(f"solver.prototxt:{line}: ") and fragment in str(info.value), str(info.value)


# ------------------------------------------------------------------------------------------------
# YAML output and the command

@pytest.mark.parametrize("value", ["plain", "with space", "true", "123", "a: b", "x#y", "[", "", "ü", "tab\there",
                                   'q"uote', "back\\slash", "-dash", "conv1/7x7_s2", "null", 5e-05, 1e20, 0.1,
                                   -2.5, 0, True, math.inf, -math.inf])
def test_yaml_scalars_read_back(value):
    text = to_yaml({"k": value, "l": [value], "m": {"n": value}})
    assert load_yaml_text(text) == {"k": value, "l": [value], "m": {"n": value}}


def test_yaml_layout_flow_wrapped_when_long():
    long = {f"key{i}": "v" * 10 for i in range(12)}
    many = [{"a": i, "b": "w" * 20} for i in range(6)]
    mapping = {"name": "n", "layers": [{"name": "a", "type": "T", "short": {"x": 1}, "long": long, "many": many}]}
    text = to_yaml(mapping, ["hello"])
    lines = text.splitlines()
    assert lines[:6] == ["# hello", "name: n", "layers:", "  - name: a", "    type: T", "    short: {x: 1}"]
    assert lines[6].startswith("    long: {key0: vvvvvvvvvv, key1:") and lines[6].endswith(",")
    assert lines[7].startswith("           key") and lines[7].endswith("}")  # aligned after the brace
    assert lines[8:10] == ["    many:", "      - {a: 0, b: wwwwwwwwwwwwwwwwwwww}"]
    assert all(len(line) <= 125 for line in lines)
    assert load_yaml_text(text) == mapping


@needs_models
def test_command_writes_yaml_with_notes(tmp_path, capsys):
    out = tmp_path / "cifar.yaml"
    assert main(["convert", str(model("cifar10__cifar10_quick_train_test.prototxt")), "-o", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert stdout == f"wrote {out} (net 'CIFAR10_quick', 15 layers)\n"
    assert "note: mean files must be .npy/.npz" in stderr and "examples/cifar10/mean.binaryproto" in stderr
    text = out.read_text()
    assert text.startswith("# Converted from cifar10__cifar10_quick_train_test.prototxt by `layerforge convert`")
    assert "# note: data sources are kept as written" in text
    assert load_net_def(str(out)).name == "CIFAR10_quick"
    # to standard output, and a solver's net given explicitly
    assert main(["convert", str(model("cifar10__cifar10_quick_solver.prototxt")), "--net", str(out)]) == 0
    stdout, _ = capsys.readouterr()
    assert f"\nnet: {os.path.relpath(out)}\n" in stdout


def test_command_errors_exit_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.prototxt"
    bad.write_text('name: "x"\nlayer {\n  name: "p"\n  type: "Frobnicate"\n}\n')
    assert main(["convert", str(bad), "-o", str(tmp_path / "bad.yaml")]) == 2
    _, stderr = capsys.readouterr()
    assert stderr == f"error: {bad}:4: layer 'p' (Frobnicate): key 'type': unsupported layer type 'Frobnicate' " \
                     "(layerforge has no such layer)\n"
    assert not (tmp_path / "bad.yaml").exists()
    good = tmp_path / "good.prototxt"
    good.write_text('input: "x"\ninput_dim: 1\ninput_dim: 1\ninput_dim: 2\ninput_dim: 2\n')
    assert main(["convert", str(good), "--net", "x.yaml"]) == 2
    assert "--net applies to solver files" in capsys.readouterr().err


def test_float_dtype_of_converted_values_survives_validation():
    net = convert_text('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 4 } } }\n'
                       'layer { name: "s" type: "Scale" bottom: "x" top: "s" scale_param { bias_term: true\n'
                       ' filler { type: "constant" value: 2 } } }')[1]
    built_net = Net(net, phase="test", dtype="float64")
    assert numpy.all(built_net.params["s"][0].data == 2.0)


# -- Caffe forks' fields and Caffe's data order (issue 25; the converter changes land with the convert split) --

AFTER_SPLIT = "issue 25: caffe/convert.py's change is applied by the lead after the convert split"


@pytest.mark.parametrize("ceil, round_mode", [("false", "FLOOR"), ("true", "CEIL"), ("0", "FLOOR")])
def test_ceil_mode_of_caffe_forks_becomes_round_mode(ceil, round_mode):
    layer = layer_of(f'layer {{ name: "p" type: "Pooling" bottom: "x" top: "p"\n'
                     f' pooling_param {{ pool: MAX kernel_size: 3 stride: 2 ceil_mode: {ceil} }} }}')
    assert layer["pooling"]["round_mode"] == round_mode and "ceil_mode" not in layer["pooling"]


@pytest.mark.parametrize("param, line, fragment", [
    ("kernel_size: 3\n  ceil_mode: false\n  round_mode: CEIL", 7,
     "key 'pooling_param.round_mode': give 'ceil_mode' (a Caffe fork's field) or 'round_mode', not both"),
    ("kernel_size: 3\n  ceil_mode: 7", 6, "key 'pooling_param.ceil_mode': Caffe field 'ceil_mode' takes true or "
                                          "false, got 7"),
    ("kernel_size: 3\n  ceil_mode: false\n  ceil_mode: true", 7, "non-repeated field given 2 times"),
])
def test_ceil_mode_errors_name_the_field_and_its_line(param, line, fragment):
    with pytest.raises(ConfigError) as info:  # the pooling_param's lines start at 4, after the Input layer of layer_of
        layer_of(f'layer {{ name: "p" type: "Pooling" bottom: "x" top: "p"\n pooling_param {{ pool: MAX\n  {param} }} }}')
    assert str(info.value).startswith(f"net.prototxt:{line}: layer 'p' (Pooling): ") and fragment in str(info.value)


DATA_LAYER = ('layer {{ name: "d" type: "Data" top: "data" top: "label" include {{ phase: TRAIN }}\n'
              ' data_param {{ source: "{source}" batch_size: 3 {extra}}} }}\n')


@pytest.mark.parametrize("extra, shuffle", [("", False), ("shuffle: true ", True), ("shuffle: false ", False)])
def test_data_layers_read_in_caffes_order_unless_asked(extra, shuffle):
    kind, net, notes = convert_text(DATA_LAYER.format(source="db", extra=extra))
    assert net["layers"][0]["data"]["shuffle"] is shuffle
    assert not any("shuffle" in note for note in notes)


def test_a_caffe_prototxt_net_reads_its_database_in_key_order_in_train(tmp_path):
    """Caffe's Data layer reads the LMDB in key order in TRAIN too: a solver of Caffe's then sees Caffe's batches."""
    from layerforge.data.lmdb_io import encode_record, write_lmdb_atomic

    write_lmdb_atomic(tmp_path / "db", (encode_record(numpy.full((1, 2, 2), i, numpy.uint8), i) for i in range(9)))
    (tmp_path / "net.prototxt").write_text('name: "n"\n' + DATA_LAYER.format(source=tmp_path / "db", extra=""))
    net = Net(str(tmp_path / "net.prototxt"), phase="train")
    batches = []
    for _ in range(4):
        net.forward()
        batches.append(net.blobs["label"].data.tolist())
    assert batches == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 2]]
