"""Net.training_pass: within a solver's forward and backward a convolution may keep what its forward derived from
its bottom for its backward (Winograd's transformed input tiles, kernels/winograd.py); outside it, and where a later
layer writes the bottom in place, nothing is kept."""
import numpy
import pytest

from layerforge import Net
from layerforge.kernels.winograd import WinogradConv
from layerforge.solvers import get_solver


def net_def(batch=2, relu_on_data=False, engine="WINOGRAD"):
    conv = {"weight_filler": {"type": "gaussian", "std": 0.2}, "bias_filler": {"type": "constant", "value": 0.1}}
    layers = [
        {"name": "data", "type": "Input", "top": ["data", "label"],
         "input": {"shape": [{"dim": [batch, 8, 10, 10]}, {"dim": [batch]}]}},
        {"name": "conv1", "type": "Convolution", "bottom": "data", "top": "conv1",
         "convolution": dict(conv, num_output=8, kernel_size=3, pad=1, engine=engine)},
        {"name": "relu1", "type": "ReLU", "bottom": "conv1", "top": "conv1"},
        {"name": "conv2", "type": "Convolution", "bottom": "conv1", "top": "conv2",
         "convolution": dict(conv, num_output=8, kernel_size=3, pad=1, engine=engine)},
        {"name": "ip", "type": "InnerProduct", "bottom": "conv2", "top": "ip",
         "inner_product": {"num_output": 3, "weight_filler": {"type": "gaussian", "std": 0.1}}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]
    if relu_on_data:  # a layer after conv1 writes conv1's bottom in place
        layers.insert(3, {"name": "relu0", "type": "ReLU", "bottom": "data", "top": "data"})
    return {"name": "kept", "force_backward": True, "layers": layers}


def solver(definition):
    s = get_solver({"net_param": definition, "base_lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3,
                    "lr_policy": "fixed", "max_iter": 100, "random_seed": 3})
    rng = numpy.random.default_rng(0)
    s.net.blobs["data"].data[...] = rng.standard_normal(s.net.blobs["data"].shape)
    s.net.blobs["label"].data[...] = [0, 2]
    return s


def engines_of(net, name):
    return list(net.layers[net._layer_index[name]].engines.values())


def test_the_convolutions_whose_bottom_stays_as_forward_read_it_keep():
    net = Net(net_def(), phase="train")
    assert [net.layers[i].name for i in net._keeping] == ["conv1", "conv2"]
    # relu0 rewrites data after conv1 has read it, in place on the Split's top of its own, not on conv1's bottom
    net = Net(net_def(relu_on_data=True), phase="train")
    assert [net.layers[i].name for i in net._keeping] == ["conv1", "conv2"]
    conv1, relu0 = net._layer_index["conv1"], net._layer_index["relu0"]
    bottom = net.bottom_blobs(conv1)[0]
    assert not net._written_later(conv1, bottom)
    net.top_blobs(relu0)[0].share_data(bottom)  # were relu0's top conv1's bottom's array, conv1 would not keep
    assert net._written_later(conv1, bottom)
    frozen = net_def()
    frozen["force_backward"] = False
    frozen["layers"][1]["param"] = [{"lr_mult": 0}, {"lr_mult": 0}]  # conv1 then has no backward to keep for
    net = Net(frozen, phase="train")
    assert [net.layers[i].name for i in net._keeping] == ["conv2"]


@pytest.mark.parametrize("relu_on_data", [False, True])
def test_a_solver_step_keeps_the_tiles_and_computes_the_same_bits(monkeypatch, relu_on_data):
    trained = {}
    for keeps in (False, True):
        monkeypatch.setattr(WinogradConv, "keeps_input_tiles", keeps)
        s = solver(net_def(relu_on_data=relu_on_data))
        kept = []
        for engine in engines_of(s.net, "conv2"):
            def backward(*args, engine=engine, original=engine.backward):
                kept.append(engine.kept is not None)
                return original(*args)
            engine.backward = backward
        s.step(4)
        assert kept == [keeps] * 4
        assert all(e.kept is None for name in ("conv1", "conv2") for e in engines_of(s.net, name))  # dropped
        trained[keeps] = [b.data.copy() for blobs in s.net.params.values() for b in blobs]
    for a, e in zip(trained[True], trained[False]):
        assert a.tobytes() == e.tobytes()


def test_a_forward_and_backward_apart_keep_nothing_and_see_a_changed_bottom():
    """pycaffe's net.forward(); change a blob; net.backward(): backward reads the bottom as it is then, as Caffe's."""
    net = solver(net_def()).net
    net.forward()
    assert all(e.kept is None for e in engines_of(net, "conv2"))
    net.blobs["conv1"].data[...] *= 2.0
    net.clear_param_diffs()
    net.backward()
    changed = net.params["conv2"][0].diff.copy()
    net.clear_param_diffs()
    net.backward()
    numpy.testing.assert_array_equal(net.params["conv2"][0].diff, changed)
    net.blobs["conv1"].data[...] /= 2.0
    net.clear_param_diffs()
    net.backward()
    numpy.testing.assert_allclose(changed, 2.0 * net.params["conv2"][0].diff, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("engine", ["WINOGRAD", "AUTO"])
def test_layerforge_time_warms_up_in_training_passes_and_once_after_the_choice(engine):
    from layerforge.commands.time import warm_up
    from layerforge.kernels.autotune import engines_settled

    net = Net(net_def(engine=engine), phase="train")
    passes = warm_up(net)
    assert engines_settled(net)
    # a given engine has nothing to choose: one pass; AUTO's choosing passes, then one with every choice made
    assert passes == 1 if engine == "WINOGRAD" else passes >= 3
    for name in ("conv1", "conv2"):
        layer = net.layers[net._layer_index[name]]
        chosen = layer.engines[layer.engine_choice["forward"]]
        if isinstance(chosen, WinogradConv) and layer.engine_choice["backward"] == layer.engine_choice["forward"]:
            # the warm-up made the tiles a training pass keeps, so the first timed pass does not
            assert chosen.kept_bytes == chosen._own_tiles.nbytes > 0
        assert all(getattr(e, "kept", None) is None for e in layer.engines.values())  # dropped after the pass
