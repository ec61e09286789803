"""cuda_graph: the cut of an iteration into data, recorded body and losses, and its refusals.

On numpy a stand-in recorder returns the body function itself, so a "replay" runs it again: the cut and the
order of the ranges must then give, bit for bit, the eager iteration. On a device the real recorder runs.
"""
import numpy
import pytest

from layerforge import Net, get_solver, rng
from layerforge.errors import ConfigError
from layerforge.solvers.cuda_graph import IterationGraphs, body_range, body_refusal, refusal
from tests.net.test_fusion import resnet_block


def net_def(dropout=False):
    d = resnet_block(True)
    if dropout:
        d["layers"].insert(-2, {"name": "drop", "type": "Dropout", "bottom": "pool", "top": "pool"})
    return d


def test_the_body_lies_between_the_data_and_the_first_loss():
    net = Net(net_def(), phase="TRAIN", dtype="float64")
    lo, hi = body_range(net)
    names = [layer.name for layer in net.layers]
    assert names[lo] == "conv1" and names[hi] == "ip" and names[hi + 1] == "loss"
    assert refusal(net, 1) == "cuda_graph needs solver_mode GPU (CUDA graphs record device work)"
    assert body_refusal(net, 1) is None


def test_the_recorded_body_gives_the_eager_iteration_bit_for_bit():
    # engines pinned: each net's AUTO times its own, and IM2COL's and IMPLICIT's weight gradients differ in last bits
    eager, graphed = (Net(pinned(net_def()), phase="TRAIN", dtype="float64") for _ in range(2))
    for name, blobs in eager.params.items():
        for a, b in zip(blobs, graphed.params[name]):
            b.data[...] = a.data
    recorded = []
    graphs = IterationGraphs(graphed, record=lambda fn: recorded.append(fn.__name__) or fn)
    for k in range(3):
        for net in (eager, graphed):
            net.clear_param_diffs()
        rng.seed(k)  # DummyData draws the same batch for both
        loss = eager.forward_backward()
        rng.seed(k)
        assert graphs.forward_backward() == loss
        for name, blobs in eager.params.items():
            for a, b in zip(blobs, graphed.params[name]):
                numpy.testing.assert_array_equal(b.diff, a.diff, err_msg=name)
    assert recorded == ["_body_forward", "_body_backward"] and graphs.failed is None  # recorded once, then replayed


def test_a_recording_that_fails_names_the_layer_and_the_iteration_goes_on_eagerly(caplog):
    net = Net(pinned(net_def()), phase="TRAIN", dtype="float64")
    reference = Net(pinned(net_def()), phase="TRAIN", dtype="float64")
    for name, blobs in reference.params.items():
        for a, b in zip(blobs, net.params[name]):
            b.data[...] = a.data

    def record(fn):
        graphs._current = graphs.lo + 2  # the failure happens inside the body, at its third layer
        raise RuntimeError("the current stream is capturing, so D2H transfers are disallowed")

    graphs = IterationGraphs(net, record=record)
    rng.seed(0)
    loss = graphs.forward_backward()
    rng.seed(0)
    assert loss == reference.forward_backward()
    third = net.layers[graphs.lo + 2]
    assert graphs.failed == f"layer '{third.name}' ({third.type}): RuntimeError: the current stream is capturing, " \
                            "so D2H transfers are disallowed"
    assert "training goes on without graphs" in caplog.text


def test_refusals_are_one_line_naming_the_key_or_the_layer():
    with pytest.raises(ConfigError, match="cuda_graph needs solver_mode GPU"):
        get_solver(dict(net_param=net_def(), cuda_graph=True, max_iter=1))
    net = Net(net_def(dropout=True), phase="TRAIN", dtype="float64")
    assert body_refusal(net, 1) == ("cuda_graph: layer 'drop' (Dropout) cannot be recorded once and replayed (it "
                                    "makes a new host-side choice every pass)")
    assert body_refusal(Net(net_def(), phase="TRAIN"), 2).startswith("cuda_graph needs iter_size 1")


def pinned(net, engine="IM2COL"):
    """``net`` (a dict) with every convolution's engine set: AUTO's trial passes would run other engines in a first
    run than in a second that finds its choices in the engine cache, and the comparisons below would see that."""
    for layer in net["layers"]:
        if layer["type"] == "Convolution":
            layer["convolution"]["engine"] = engine
    return net


def device_solver(source, **keys):
    """A GPU solver of ``source``: "lenet" (configs/lenet_solver.yaml and its net) or "resnet block"."""
    import yaml

    from tests.test_cli import ROOT

    common = dict(solver_mode="GPU", average_loss=12, display=0, test_interval=0, snapshot=0,
                  snapshot_after_train=False, **keys)
    if source == "lenet":
        solver = yaml.safe_load((ROOT / "configs" / "lenet_solver.yaml").read_text())
        solver.pop("net")
        return get_solver(dict(solver, net_param=pinned(yaml.safe_load((ROOT / "configs" / "lenet.yaml").read_text())),
                               **common))
    return get_solver(dict(net_param=pinned(net_def()), base_lr=0.1, momentum=0.9, random_seed=2, **common))


def assert_same_training(graphed, eager):
    numpy.testing.assert_allclose(list(graphed.losses), list(eager.losses), rtol=1e-6)
    for name, blobs in eager.net.params.items():
        for a, b in zip(blobs, graphed.net.params[name]):
            numpy.testing.assert_allclose(b.data.get(), a.data.get(), rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("source, iterations", [("lenet", 4), ("resnet block", 12)])
def test_training_with_graphs_on_the_device_equals_training_without(source, iterations):
    runs = []
    for graph in (False, True):
        solver = device_solver(source, max_iter=iterations, cuda_graph=graph)
        solver.solve()
        runs.append(solver)
    eager, graphed = runs
    assert graphed.graphs is not None and graphed.graphs.failed is None
    assert graphed.graphs.forward_graph is not None and graphed.graphs.backward_graph is not None
    assert_same_training(graphed, eager)


@pytest.mark.parametrize("host_side, error", [
    ("read", "RuntimeError: the current stream is capturing, so D2H transfers are disallowed"),  # cupy's own check
    ("synchronize", "cudaErrorStreamCaptureUnsupported"),  # CUDA's
])
def test_a_host_synchronisation_in_the_body_ends_the_recording_and_training_goes_on_eagerly(caplog, monkeypatch,
                                                                                            host_side, error):
    """A body layer that reads a device value on the host, or waits for its stream: the real capture refuses it,
    the recording ends naming the layer, and the iterations run eagerly with the eager run's results."""
    from layerforge.layers.pooling import Pooling

    pooling_forward = Pooling.forward

    def forward(self, bottom, top):
        pooling_forward(self, bottom, top)
        if host_side == "read":
            float(top[0].data.sum())
        else:
            self.xp.cuda.get_current_stream().synchronize()

    monkeypatch.setattr(Pooling, "forward", forward)
    eager = device_solver("resnet block", max_iter=4)
    eager.solve()
    graphed = device_solver("resnet block", max_iter=4, cuda_graph=True)
    graphed.solve()
    assert graphed.graphs is not None and graphed.graphs.forward_graph is None
    # (the block's ReLUs run fused, with their BatchNorm and Scale or their Eltwise: the pooling layer runs alone)
    assert graphed.graphs.failed.startswith("layer 'pool' (Pooling): ") and error in graphed.graphs.failed
    assert caplog.text.count("training goes on without graphs") == 1
    assert_same_training(graphed, eager)


@pytest.mark.parametrize("keys, message", [
    (dict(net_param=net_def(dropout=True)), "cuda_graph: layer 'drop' (Dropout) cannot be recorded once and replayed"),
    (dict(net_param=net_def(), iter_size=2), "cuda_graph needs iter_size 1"),
])
def test_the_device_refuses_what_cannot_be_recorded_in_one_line(keys, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        get_solver(dict(solver_mode="GPU", cuda_graph=True, max_iter=1, **keys))
    assert "\n" not in str(e.value) and e.value.key == "cuda_graph"


def test_a_moved_array_makes_the_graphs_record_again():
    net = Net(net_def(), phase="TRAIN", dtype="float64")
    recorded = []
    graphs = IterationGraphs(net, record=lambda fn: recorded.append(fn.__name__) or fn)
    graphs.forward_backward()
    graphs.forward_backward()
    assert len(recorded) == 2
    weights = net.params["ip"][0]
    weights.diff = weights.diff.copy()  # a new array where the recorded graph would still write the old one
    graphs.forward_backward()
    assert recorded == ["_body_forward", "_body_backward"] * 2


def test_a_data_layer_inside_the_body_is_refused():
    d = net_def()
    d["layers"].insert(3, {"name": "late", "type": "DummyData", "top": "extra",
                           "dummy_data": {"shape": [[6, 2]], "data_filler": [{"type": "gaussian"}]}})
    d["layers"].insert(4, {"name": "quiet", "type": "Silence", "bottom": "extra"})
    net = Net(d, phase="TRAIN", dtype="float64")
    assert body_refusal(net, 1) == ("cuda_graph: layer 'late' (DummyData) has no bottoms but comes after the "
                                    "first layer with one: put the data layers first")
