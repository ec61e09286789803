"""Caffe's net semantics, checked against what src/caffe/test/test_net.cpp and test_gradient_based_solver.cpp assert.

NetState from the net file, param_propagate_down (lr_mult 0), propagate_down, repeated layer names,
automatic loss tops, and where the solver clips (before iter_size normalisation).
"""
import math

import numpy
import pytest

import layerforge
from layerforge.errors import ConfigError

from ..solvers import dataset, fed_solver, linear_grads, linear_net


def _input(shape=((4, 3), (4,))):
    return {"name": "input", "type": "Input", "top": ["data", "label"], "input": {"shape": [list(s) for s in shape]}}


def _ip(name, bottom, top, n=3, param=None, **extra):
    layer = {"name": name, "type": "InnerProduct", "bottom": bottom, "top": top,
             "inner_product": {"num_output": n, "weight_filler": {"type": "gaussian", "std": 0.5},
                               "bias_filler": {"type": "gaussian", "std": 0.5}}}
    if param is not None:
        layer["param"] = param
    layer.update(extra)
    return layer


def _feed(seed=0):
    g = numpy.random.default_rng(seed)
    return {"data": g.standard_normal((4, 3)), "label": numpy.array([0, 2, 1, 2], dtype=float)}


def _names(net, splits=True):
    return [layer.name for layer in net.layers if splits or layer.type != "Split"]


# ---------------------------------------------------------------------------------------------
# 1. the net's own state selects layers unless Net(...) is told otherwise

def _state_net(state=None):
    layers = [_input(),
              _ip("train_only", "data", "a", include={"phase": "TRAIN"}),
              _ip("test_only", "data", "b", include={"phase": "TEST"}),
              _ip("deep", "data", "c", include={"min_level": 2}),
              _ip("staged", "data", "d", include={"stage": "deploy"})]
    net = {"name": "state", "layers": layers}
    if state is not None:
        net["state"] = state
    return net


def test_net_state_selects_layers_without_arguments():
    net = layerforge.Net(_state_net({"phase": "TEST", "level": 2, "stage": ["deploy"]}))
    assert net.phase == "TEST"
    assert _names(net, splits=False) == ["input", "test_only", "deep", "staged"]


def test_explicit_arguments_override_the_state_and_stages_add_to_it():
    definition = _state_net({"phase": "TEST", "level": 2, "stage": ["deploy"]})
    assert _names(layerforge.Net(definition, phase="train"), False) == ["input", "train_only", "deep", "staged"]
    assert _names(layerforge.Net(definition, level=0), False) == ["input", "test_only", "staged"]
    # Caffe's Net(file, phase, level, stages) appends the given stages to the file's
    assert _names(layerforge.Net(definition, stages=["other"]), False) == ["input", "test_only", "deep", "staged"]


def test_without_state_or_arguments_the_phase_is_train():
    assert _names(layerforge.Net(_state_net())) == ["input", "train_only"]


def test_prototxt_state_converts_and_selects(tmp_path):
    text = ("name: 'p' state { phase: TEST level: 3 stage: 'deploy' }\n"
            "layer { name: 'input' type: 'Input' top: 'data' input_param { shape { dim: 2 dim: 3 } } }\n"
            "layer { name: 'deep' type: 'InnerProduct' bottom: 'data' top: 'deep'\n"
            "  inner_product_param { num_output: 2 } include { min_level: 3 stage: 'deploy' phase: TEST } }\n"
            "layer { name: 'shallow' type: 'InnerProduct' bottom: 'data' top: 'shallow'\n"
            "  inner_product_param { num_output: 2 } include { max_level: 2 } }\n")
    path = tmp_path / "state.prototxt"
    path.write_text(text)
    net = layerforge.Net(path)
    assert net.phase == "TEST"
    assert _names(net, False) == ["input", "deep"]
    assert _names(layerforge.Net(path, level=1), False) == ["input", "shallow"]


ALL_IN_ONE = """name: 'All-in-one Network'
layer { name: 'train-data' type: 'DummyData' top: 'data' top: 'label'
  dummy_data_param { shape { dim: 1 dim: 10 } shape { dim: 1 dim: 1 } } include { phase: TRAIN stage: 'train' } }
layer { name: 'val-data' type: 'DummyData' top: 'data' top: 'label'
  dummy_data_param { shape { dim: 1 dim: 10 } shape { dim: 1 dim: 1 } } include { phase: TEST stage: 'val' } }
layer { name: 'deploy-data' type: 'Input' top: 'data' input_param { shape { dim: 1 dim: 10 } }
  include { phase: TEST stage: 'deploy' } }
layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip' inner_product_param { num_output: 2 } }
layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss'
  include { phase: TRAIN stage: 'train' } include { phase: TEST stage: 'val' } }
"""


@pytest.mark.parametrize("phase, stage, expected", [
    ("train", "train", ["train-data", "ip", "loss"]),     # TestAllInOneNetTrain
    ("test", "val", ["val-data", "ip", "loss"]),          # TestAllInOneNetVal
    ("test", "deploy", ["deploy-data", "ip"]),            # TestAllInOneNetDeploy
])
def test_all_in_one_net_as_caffe(tmp_path, phase, stage, expected):
    path = tmp_path / "all_in_one.prototxt"
    path.write_text(ALL_IN_ONE)
    assert _names(layerforge.Net(path, phase=phase, stages=[stage]), False) == expected
    path.write_text(ALL_IN_ONE + f"state {{ phase: {phase.upper()} stage: '{stage}' }}\n")
    assert _names(layerforge.Net(path), False) == expected  # the same NetState from the file


# ---------------------------------------------------------------------------------------------
# 2. lr_mult 0: no gradient for that parameter (param_propagate_down), none into bottoms nobody needs

def _two_ip_net(lr=(1, 1, 1, 1), force_backward=False):
    """Caffe's InitUnsharedWeightsNet shape: two InnerProducts on one input, their outputs summed by a loss."""
    return {"name": "two", "force_backward": force_backward, "layers": [
        _input(),
        _ip("ip1", "data", "ip1", param=[{"lr_mult": lr[0]}, {"lr_mult": lr[2]}]),
        _ip("ip2", "data", "ip2", param=[{"lr_mult": lr[1]}, {"lr_mult": lr[3]}]),
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["ip1", "ip2"], "top": "loss"}]}


def _grads(definition):
    layerforge.rng.seed(3)
    net = layerforge.Net(definition, dtype="float64")
    net.forward(**_feed())
    net.backward()
    return net, [numpy.abs(net.params[n][j].diff).sum() for j in (0, 1) for n in ("ip1", "ip2")]


def test_param_propagate_down_as_caffe():
    # test_net.cpp TestParamPropagateDown: order W1, W2, b1, b2
    _, full = _grads(_two_ip_net())
    assert min(full) > 1e-3
    _, doubled = _grads(_two_ip_net((2, 2, 4, 4)))
    numpy.testing.assert_allclose(doubled, full, rtol=1e-12)
    for lr, zero in (((1, 0, 0, 1), (1, 2)), ((0, 1, 1, 0), (0, 3))):
        _, some = _grads(_two_ip_net(lr))
        for i in range(4):
            assert some[i] == (0.0 if i in zero else pytest.approx(full[i], rel=1e-12))


def test_lr_mult_zero_leaves_a_given_diff_untouched_and_force_backward_computes_it():
    net, _ = _grads(_two_ip_net((0, 1, 1, 1)))
    assert net.layer_dict["ip1"].param_propagate_down == [False, True]
    net.params["ip1"][0].diff[...] = 7.0  # a diff nobody computes keeps what it had
    net.backward()
    assert (net.params["ip1"][0].diff == 7.0).all()
    forced, grads = _grads(_two_ip_net((0, 1, 1, 1), force_backward=True))
    assert forced.layer_dict["ip1"].param_propagate_down == [True, True]  # Caffe: force_backward computes every diff
    assert grads[0] > 1e-3


def test_bottoms_nobody_needs_get_no_diff():
    definition = {"name": "n", "layers": [_input(), _ip("ip1", "data", "ip1", param=[{"lr_mult": 0}, {"lr_mult": 0}]),
                                          _ip("ip2", "ip1", "ip2"),
                                          {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip2", "label"]}]}
    net = layerforge.Net(definition, dtype="float64")
    assert net.bottom_need_backward[_names(net).index("ip2")] == [False]
    assert not net.layer_need_backward[_names(net).index("ip1")]
    net.forward(**_feed())
    net.blobs["ip1"].diff[...] = 5.0
    net.backward()
    assert (net.blobs["ip1"].diff == 5.0).all()
    assert numpy.abs(net.params["ip2"][0].diff).sum() > 0


def test_frozen_parameter_is_left_out_of_the_clip_norm():
    x, y = dataset(4)
    net = linear_net(batch=4, lr_mult=(0.0, 1.0), decay_mult=(0.0, 0.0))
    solver = fed_solver(x, y, 4, net=net, base_lr=1.0, clip_gradients=1e-3)
    w, b = (p.data.copy() for p in solver.net.learnable_params)
    gw, gb = linear_grads(w, b, x, y)
    assert numpy.linalg.norm(gw) > 1e-3 and numpy.linalg.norm(gb) > 1e-3  # both would count in the norm
    solver.step(1)
    numpy.testing.assert_array_equal(solver.net.learnable_params[0].data, w)
    expected = b - gb * min(1.0, 1e-3 / numpy.linalg.norm(gb))
    numpy.testing.assert_allclose(solver.net.learnable_params[1].data, expected, rtol=1e-10)


# ---------------------------------------------------------------------------------------------
# 3. propagate_down: given for every bottom or none; true forces, false stops

def _force_prop_net(force):
    ip = _ip("innerproduct", "data", "innerproduct", n=1)
    if force:
        ip["propagate_down"] = [True]
    return {"name": "ForcePropTestNetwork", "layers": [
        {"name": "data", "type": "DummyData", "top": ["data", "label"],
         "dummy_data": {"shape": [[5, 2, 3, 4], [5]],
                        "data_filler": [{"type": "gaussian", "std": 0.01}, {"type": "constant", "value": 0}]}},
        ip, {"name": "loss", "type": "SigmoidCrossEntropyLoss", "bottom": ["innerproduct", "label"],
             "top": "cross_entropy_loss"}]}


@pytest.mark.parametrize("force", [False, True])
def test_force_propagate_down_as_caffe(force):
    net = layerforge.Net(_force_prop_net(force), dtype="float64")
    need = dict(zip(_names(net), net.bottom_need_backward))
    assert need == {"data": [], "innerproduct": [force], "loss": [True, False]}
    assert net.layer_need_backward == [False, True, True]
    net.forward()
    net.backward()
    assert (numpy.abs(net.blobs["data"].diff).sum() > 0) == force


def _tiny_net(loss="SoftmaxWithLoss", force_backward=False):
    # test_net.cpp InitTinyNet / InitTinyNetEuclidean
    label = [5] if loss == "SoftmaxWithLoss" else [5, 1]
    return {"name": "TinyTestNetwork", "force_backward": force_backward, "layers": [
        {"name": "data", "type": "DummyData", "top": ["data", "label"],
         "dummy_data": {"shape": [[5, 10], label], "data_filler": [{"type": "gaussian", "std": 0.01},
                                                                  {"type": "constant", "value": 0}]}},
        _ip("innerproduct", "data", "innerproduct", n=1000 if loss == "SoftmaxWithLoss" else 1),
        {"name": "loss", "type": loss, "bottom": ["innerproduct", "label"]}]}


@pytest.mark.parametrize("loss, force, expected", [
    ("SoftmaxWithLoss", False, [[], [False], [True, False]]),        # TestBottomNeedBackward
    ("SoftmaxWithLoss", True, [[], [True], [True, False]]),          # TestBottomNeedBackwardForce
    ("EuclideanLoss", True, [[], [True], [True, True]]),             # TestBottomNeedBackwardEuclideanForce
])
def test_bottom_need_backward_as_caffe(loss, force, expected):
    net = layerforge.Net(_tiny_net(loss, force))
    assert net.bottom_need_backward == expected


def _skip_prop_net(skip):
    return {"name": "SkipPropTestNetwork", "layers": [
        {"name": "data", "type": "DummyData", "top": ["data", "label"],
         "dummy_data": {"shape": [[5, 2, 3, 4], [5]],
                        "data_filler": [{"type": "gaussian", "std": 0.01}, {"type": "constant", "value": 0}]}},
        {"name": "silence", "type": "Silence", "bottom": "label"},
        _ip("innerproduct", "data", "innerproduct", n=1, param=[{"lr_mult": 1, "decay_mult": 1},
                                                                 {"lr_mult": 2, "decay_mult": 0}]),
        _ip("ip_fake_labels", "data", "fake_labels", n=1),
        {"name": "argmax", "type": "ArgMax", "bottom": "fake_labels", "top": "label_argmax"},
        {"name": "loss", "type": "SigmoidCrossEntropyLoss", "bottom": ["innerproduct", "label_argmax"],
         "top": "cross_entropy_loss", "loss_weight": 0.1, "propagate_down": [True, not skip]}]}


def test_skip_propagate_down_as_caffe():
    net = layerforge.Net(_skip_prop_net(skip=False))
    names = _names(net)
    assert net.bottom_need_backward[names.index("loss")][1]
    for name, need in zip(names, net.layer_need_backward):
        if name in ("data", "silence") or name.endswith("_split"):
            continue
        assert need, name
    net.forward()
    with pytest.raises(ConfigError, match="propagate_down"):  # Caffe: cannot backpropagate to label inputs
        net.backward()
    net = layerforge.Net(_skip_prop_net(skip=True))
    names = _names(net)
    assert not net.bottom_need_backward[names.index("loss")][1]
    for name, need in zip(names, net.layer_need_backward):
        if not name.endswith("_split"):
            assert need == (name in ("innerproduct", "loss")), name


def _tricky_net(**keys):
    # test_net.cpp InitTrickyNet: the loss's label comes out of an InnerProduct, so Caffe asks it for a gradient
    return {"name": "tricky", **keys, "layers": [
        _input(((4, 3), (4, 1))),
        _ip("innerproduct", "data", "transformed_data", n=3),
        _ip("label_ip", "label", "transformed_label", n=1),
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["transformed_data", "transformed_label"]}]}


def test_tricky_label_needs_backward_as_caffe_and_the_key_skips_it():
    net = layerforge.Net(_tricky_net())
    assert net.bottom_need_backward == [[], [False], [False], [True, True]]
    skipping = layerforge.Net(_tricky_net(skip_undifferentiable=True))
    assert skipping.bottom_need_backward == [[], [False], [False], [True, False]]
    assert not skipping.layer_need_backward[2]


def test_propagate_down_true_cannot_wake_a_layer_nothing_else_needs():
    # Caffe: the flag is set, but the layer's own need comes from its bottoms' blobs and parameters only
    definition = {"name": "n", "layers": [_input(),
                                          {"name": "relu", "type": "ReLU", "bottom": "data", "top": "r",
                                           "propagate_down": [True]},
                                          _ip("ip", "r", "ip"),
                                          {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"]}]}
    net = layerforge.Net(definition, dtype="float64")
    i = net._index_of("relu")
    assert net.bottom_need_backward[i] == [True] and not net.layer_need_backward[i]
    assert net.bottom_need_backward[net._index_of("ip")] == [False]
    net.forward(**_feed())
    net.backward()
    assert not net.blobs["data"].diff.any()


def _argmax_under_loss(**keys):
    return {"name": "am", **keys, "layers": [
        _input(((4, 3), (4, 1))), _ip("ip", "data", "ip"),
        {"name": "argmax", "type": "ArgMax", "bottom": "ip", "top": "idx"},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["idx", "label"]}]}


def test_layer_without_backward_under_a_loss_stops_backward_unless_skipped():
    net = layerforge.Net(_argmax_under_loss(), dtype="float64")
    assert net.layer_need_backward == [False, True, True, True]  # Caffe asks ArgMax for a gradient...
    net.forward(**_feed())
    with pytest.raises(ConfigError, match=r"layer 'argmax' \(ArgMax\): key 'type': ArgMax layers have no backward"):
        net.backward()  # ... and its NOT_IMPLEMENTED stops; here a one-line error
    skipping = layerforge.Net(_argmax_under_loss(skip_undifferentiable=True), dtype="float64")
    assert skipping.layer_need_backward == [False, False, False, False]  # nothing with parameters is reached
    skipping.forward(**_feed())
    skipping.backward()
    assert not skipping.params["ip"][0].diff.any()


def test_propagate_down_count_must_match_bottoms():
    definition = _force_prop_net(False)
    definition["layers"][2]["propagate_down"] = [True]
    with pytest.raises(ConfigError, match=r"key 'propagate_down': has 1 entries for 2 bottoms"):
        layerforge.Net(definition)


def test_propagate_down_false_still_lets_parameters_learn():
    definition = {"name": "n", "layers": [_input(), _ip("ip1", "data", "ip1"),
                                          _ip("ip2", "ip1", "ip2", propagate_down=[False]),
                                          {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip2", "label"]}]}
    net = layerforge.Net(definition, dtype="float64")
    assert net.layer_need_backward[1:] == [False, True, True]
    net.forward(**_feed())
    net.backward()
    assert not net.params["ip1"][0].diff.any() and net.params["ip2"][0].diff.any()


def _in_place_chain(fuse, stop_at):
    # conv -> BatchNorm -> Scale -> ReLU, all in place on 'c' (a fused group unless fuse_batch_norm is false);
    # the layer named ``stop_at`` sets propagate_down: false
    layers = [_input(((4, 2, 5, 5), (4,))),
              {"name": "conv", "type": "Convolution", "bottom": "data", "top": "c",
               "convolution": {"num_output": 3, "kernel_size": 3, "weight_filler": {"type": "gaussian", "std": 0.5}}},
              {"name": "bn", "type": "BatchNorm", "bottom": "c", "top": "c"},
              {"name": "scale", "type": "Scale", "bottom": "c", "top": "c", "scale": {"bias_term": True}},
              {"name": "relu", "type": "ReLU", "bottom": "c", "top": "c"},
              _ip("ip", "c", "ip"),
              {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"]}]
    for layer in layers:
        if layer["name"] == stop_at:
            layer["propagate_down"] = [False]
    return {"name": "chain", "fuse_batch_norm": fuse, "layers": layers}


@pytest.mark.parametrize("fuse, stop_at, needs, learning", [
    (False, "relu", {"relu"}, {"ip"}),
    (True, "relu", {"relu"}, {"ip"}),
    (True, "scale", {"scale", "relu"}, {"scale", "ip"}),
    (True, "ip", set(), {"ip"}),
])
def test_propagate_down_false_in_an_in_place_chain_as_caffe(fuse, stop_at, needs, learning):
    # Caffe's bottom_need_backward: a blob nobody sends a gradient into stops backward for every layer above it
    # in the chain, whose parameters get no gradient (the layer that stops still learns its own)
    net = layerforge.Net(_in_place_chain(fuse, stop_at), dtype="float64")
    need = dict(zip(_names(net), net.layer_need_backward))
    assert {name for name in ("conv", "bn", "scale", "relu") if need[name]} == needs
    g = numpy.random.default_rng(0)
    net.forward(data=g.standard_normal((4, 2, 5, 5)), label=numpy.array([0, 2, 1, 2.0]))
    net.backward()
    got = {name for name, blobs in net.params.items() if name != "bn" and any(b.diff.any() for b in blobs)}
    assert got == learning


# ---------------------------------------------------------------------------------------------
# 4. repeated layer names

def _repeated_names(**keys):
    return {"name": "rep", **keys, "layers": [
        _input(),
        _ip("ip", "data", "a", param=[{"name": "w"}, {}]),
        _ip("ip", "data", "b", param=[{"name": "w"}, {}]),
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["a", "b"], "top": "loss"}]}


def test_repeated_layer_names_as_caffe():
    net = layerforge.Net(_repeated_names(), dtype="float64")
    first, second = (layer for layer in net.layers if layer.name == "ip")
    assert first.name == second.name == "ip"
    assert net.layer_dict["ip"] is second  # layer_names_index_ keeps the last
    assert [name for name in net.layer_dict if "split" not in name] == ["input", "ip", "loss"]
    assert net.params["ip"] is second.blobs
    assert first.blobs[0] is second.blobs[0] and first.blobs[1] is not second.blobs[1]  # shared by param name
    assert len(net.learnable_params) == 3
    net.forward(**_feed())
    net.backward()
    # the shared weight's diff is the sum of both layers' contributions: a - b has opposite signs for them
    x, r = _feed()["data"], (net.blobs["a"].data - net.blobs["b"].data) / 4
    numpy.testing.assert_allclose(first.blobs[0].diff, r.T @ x - r.T @ x, atol=1e-12)
    numpy.testing.assert_allclose(first.blobs[1].diff, r.sum(0), rtol=1e-10)
    numpy.testing.assert_allclose(second.blobs[1].diff, -r.sum(0), rtol=1e-10)
    net.forward(start="ip")  # a name means the last layer of that name
    assert net.layers[net._index_of("ip")] is second


def test_repeated_names_keep_every_layer_in_weights_files(tmp_path):
    net = layerforge.Net(_repeated_names(), dtype="float64")
    first, second = (layer for layer in net.layers if layer.name == "ip")
    assert [key for key, _ in net.param_keys()] == ["ip", "ip#2"]
    path = tmp_path / "w.npz"
    net.save(path)
    layerforge.rng.seed(11)
    other = layerforge.Net(_repeated_names(), dtype="float64")
    other.load(path)
    mine, theirs = (layer for layer in other.layers if layer.name == "ip")
    for a, b in ((first, mine), (second, theirs)):
        for pa, pb in zip(a.blobs, b.blobs):
            numpy.testing.assert_array_equal(pa.data, pb.data)
    # a file with Caffe's names only (one entry per name) fills the first layer of that name
    fresh = layerforge.Net(_repeated_names(), dtype="float64")
    kept = fresh.params["ip"][1].data.copy()
    fresh.copy_from({"ip/1": numpy.full(3, 4.0)})
    mine, theirs = (layer for layer in fresh.layers if layer.name == "ip")
    assert (mine.blobs[1].data == 4.0).all()
    numpy.testing.assert_array_equal(theirs.blobs[1].data, kept)


@pytest.mark.parametrize("key", ["unique_layer_names", "skip_undifferentiable"])
def test_net_options_are_booleans(key):
    with pytest.raises(ConfigError, match=f"key '{key}': expected true or false"):
        layerforge.Net({**_repeated_names(), key: "yes"})


def test_unique_layer_names_key_rejects_repeats():
    with pytest.raises(ConfigError, match=r"layer 'ip' \(InnerProduct\): key 'name': layer name 'ip' is already used"):
        layerforge.Net(_repeated_names(unique_layer_names=True))


# ---------------------------------------------------------------------------------------------
# 5. a loss written without a top gets Caffe's automatic one

def test_loss_without_top_gets_an_automatic_counted_top():
    definition = {"name": "n", "layers": [_input(), _ip("ip", "data", "ip"),
                                          {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"],
                                           "loss_weight": 2.0}]}
    net = layerforge.Net(definition, dtype="float64")
    out = net.forward(**_feed())
    assert net.top_names(2) == ["(automatic)"]
    assert net.loss_weights(2) == [2.0]
    assert out == {} and net.outputs == []  # not an output, as Caffe keeps it out of available_blobs
    value = float(net.blobs["(automatic)"].data)
    assert value > 0 and net.loss == pytest.approx(2.0 * value, rel=1e-12)
    net.backward()
    assert net.params["ip"][0].diff.any()


def test_automatic_top_cannot_be_read_by_another_layer():
    definition = {"name": "n", "layers": [_input(), _ip("ip", "data", "ip"),
                                          {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"]},
                                          {"name": "p", "type": "Power", "bottom": "(automatic)", "top": "p"}]}
    with pytest.raises(ConfigError, match=r"bottom '\(automatic\)' is not produced by any layer"):
        layerforge.Net(definition)


def test_prototxt_loss_without_top_converts_and_counts(tmp_path):
    text = ("name: 'p' layer { name: 'input' type: 'Input' top: 'x' top: 'y'\n"
            "  input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 3 } } }\n"
            "layer { name: 'loss' type: 'EuclideanLoss' bottom: 'x' bottom: 'y' }\n")
    path = tmp_path / "loss.prototxt"
    path.write_text(text)
    net = layerforge.Net(path, dtype="float64")
    x = numpy.arange(6.0).reshape(2, 3)
    net.forward(x=x, y=numpy.zeros((2, 3)))
    assert net.loss == pytest.approx((x ** 2).sum() / 4, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# 6. clipping on the accumulated sum, before iter_size normalisation (SGDSolver::ApplyUpdate)

@pytest.mark.parametrize("after", [False, True])
def test_clip_before_normalize_with_iter_size(after):
    x, y = dataset(8)
    net = linear_net(batch=4, lr_mult=(1.0, 1.0), decay_mult=(0.0, 0.0))
    probe = fed_solver(x, y, 4, net=net)
    w, b = (p.data.copy() for p in probe.net.learnable_params)
    g = [a + c for a, c in zip(linear_grads(w, b, x[:4], y[:4]), linear_grads(w, b, x[4:], y[4:]))]  # summed passes
    norm_sum = math.sqrt(sum(float((t ** 2).sum()) for t in g))
    clip = 0.75 * norm_sum  # between the norm of the mean (0.5 x) and of the sum: only Caffe's order clips
    keys = {"clip_after_normalize": True} if after else {}
    solver = fed_solver(x, y, 4, net=net, base_lr=1.0, iter_size=2, clip_gradients=clip, **keys)
    solver.step(1)
    scale = 1.0 if after else clip / norm_sum
    for p, start, grad in zip(solver.net.learnable_params, (w, b), g):
        numpy.testing.assert_allclose(p.data, start - scale * grad / 2, rtol=1e-10)
