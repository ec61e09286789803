"""A seeded run's training repeats bit for bit whether AUTO timed the engines in this run or found them in the engine
cache: AUTO's timing calls go round-robin over the engines (whose results differ in the last bits), so a first run
used to compute its first iterations with a mixture of engines where a run with a warm cache computed them with the
chosen ones. The solver now settles the choices before its first counted iteration, on scratch arrays
(autotune.settle_apart), touching none of the net's blobs, its random streams, its BatchNorm statistics or its
parameters' diffs."""
import logging

import numpy
import pytest

from layerforge import Net, rng
from layerforge.kernels import blas, engine_cache
from layerforge.kernels.autotune import AutoChoice, engines_settled, settle_apart
from layerforge.solvers import get_solver

NET = {"name": "repeats", "layers": [
    {"name": "data", "type": "DummyData", "top": ["x", "label"],
     "dummy_data": {"shape": [[6, 8, 12, 12], [6]], "integer": [False, True],
                    "data_filler": [{"type": "gaussian"}, {"type": "uniform", "min": 0, "max": 3}]}},
    {"name": "conv1", "type": "Convolution", "bottom": "x", "top": "conv1",
     "convolution": {"num_output": 16, "kernel_size": 3, "pad": 1, "weight_filler": {"type": "gaussian", "std": 0.3}}},
    {"name": "bn", "type": "BatchNorm", "bottom": "conv1", "top": "conv1"},
    {"name": "relu", "type": "ReLU", "bottom": "conv1", "top": "conv1"},
    {"name": "drop", "type": "Dropout", "bottom": "conv1", "top": "conv1", "dropout": {"dropout_ratio": 0.3}},
    {"name": "conv2", "type": "Convolution", "bottom": "conv1", "top": "conv2",
     "convolution": {"num_output": 8, "kernel_size": 3, "stride": 2, "weight_filler": {"type": "gaussian", "std": 0.3}}},
    {"name": "ip", "type": "InnerProduct", "bottom": "conv2", "top": "ip",
     "inner_product": {"num_output": 3, "weight_filler": {"type": "gaussian", "std": 0.3}}},
    {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]}


@pytest.fixture(autouse=True)
def _batch_invariance_off(monkeypatch):
    """These runs count AUTO's timed calls and follow which engine computed what. Batch invariance, on by default,
    times a net's forward apart before its first pass (Net.forward: autotune.settle_apart), where IM2COL and
    IMPLICIT agree bit for bit anyway; tests/net/test_batch_invariance.py checks that case."""
    monkeypatch.setitem(blas._BATCH_INVARIANT, "on", False)


def rig(monkeypatch, fast):
    """AUTO's timer says engine ``fast`` is the quicker, whatever this machine measures: the round-robin's first
    calls then compute with the other engine at some point (IM2COL is timed first, IMPLICIT second)."""
    record = AutoChoice.record
    monkeypatch.setattr(AutoChoice, "record", lambda self, name, seconds: record(self, name, 1.0 if name == fast else 2.0))


def seeded_run(xp, monkeypatch, cache, iterations=8):
    """A seeded run of ``iterations`` on ``xp``'s backend with the engine cache in ``cache``: its losses, its final
    weights (bytes) and its convolutions' choices."""
    monkeypatch.setenv(engine_cache.CACHE_DIR_ENV, str(cache))
    solver = get_solver(dict(net_param=NET, base_lr=0.05, momentum=0.9, max_iter=iterations, random_seed=7,
                             display=0, test_interval=0, snapshot=0, snapshot_after_train=False,
                             solver_mode="CPU" if xp is numpy else "GPU"))
    losses = []
    solver.add_callback(lambda iteration, loss: losses.append(loss))
    solver.solve()
    host = (lambda a: a) if xp is numpy else xp.asnumpy
    weights = {name: [host(b.data).tobytes() for b in blobs]
               for name, blobs in solver.net.params.items()}
    return losses, weights, {k: solver.net.layer_dict[k].engine_choice for k in ("conv1", "conv2")}


@pytest.mark.parametrize("fast", ["IM2COL", "IMPLICIT"])
def test_a_seeded_run_repeats_from_an_empty_cache_and_from_a_warm_one(xp, tmp_path, monkeypatch, fast):
    rig(monkeypatch, fast)
    first = seeded_run(xp, monkeypatch, tmp_path / "a")
    second = seeded_run(xp, monkeypatch, tmp_path / "b")  # an empty cache again
    warm = seeded_run(xp, monkeypatch, tmp_path / "a")  # the first run's cache: nothing timed
    assert first[2] == {"conv1": {"forward": fast, "backward": fast}, "conv2": {"forward": fast, "backward": fast}}
    assert len(first[0]) == 8 and first[0][-1] != first[0][0]
    assert second == first
    assert warm == first  # bit for bit: losses (floats) and every weight's bytes


def snapshot_of(net, xp):
    """Every array of ``net`` a trial must leave alone: blobs' data and diffs, parameters' data and diffs (the
    BatchNorm statistics among them), and the random stream's state."""
    host = (lambda a: a) if xp is numpy else xp.asnumpy
    arrays = {f"blob {name} {k}": host(getattr(b, k)).copy() for name, b in net.blobs.items() for k in ("data", "diff")}
    arrays.update({f"param {name} {i} {k}": host(getattr(b, k)).copy() for name, blobs in net.params.items()
                   for i, b in enumerate(blobs) for k in ("data", "diff")})
    return arrays, repr(rng.get_state())


def test_settle_apart_times_on_scratch_arrays_and_touches_nothing_of_the_net(xp, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(engine_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    rig(monkeypatch, "IMPLICIT")
    net = Net(NET, phase="train", xp=xp)
    net.forward()
    net.backward()  # blobs, diffs and BatchNorm statistics that hold values; round-robin calls: IM2COL's
    before = snapshot_of(net, xp)
    calls = []
    record = AutoChoice.record
    monkeypatch.setattr(AutoChoice, "record", lambda self, name, seconds: calls.append(name) or record(self, name, seconds))
    with caplog.at_level(logging.INFO, logger="layerforge"):
        seconds = settle_apart(net)
    assert engines_settled(net) and seconds > 0
    # both convolutions, both directions: (1 untimed + 2 timed rounds) x 2 engines, less the round already run
    assert len(calls) == 4 * 5
    after = snapshot_of(net, xp)
    assert after[1] == before[1]
    for key, array in before[0].items():
        assert after[0][key].tobytes() == array.tobytes(), key
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("AUTO chose engines")]
    assert len(summaries) == 1 and summaries[0].startswith(
        "AUTO chose engines for 4 directions of Convolution layers in ")  # one line for every layer
    assert "forward engine IMPLICIT 2; backward engine IMPLICIT 2" in summaries[0]
    assert settle_apart(net) == 0.0  # nothing left to settle


def test_settle_apart_times_only_the_directions_the_net_runs(xp, tmp_path, monkeypatch):
    monkeypatch.setenv(engine_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    test_net = Net(NET, phase="test", xp=xp)
    settle_apart(test_net, ("forward",))
    assert {k: test_net.layer_dict[k].engine_choice["backward"] for k in ("conv1", "conv2")} == \
        {"conv1": None, "conv2": None}
    assert None not in {test_net.layer_dict[k].engine_choice["forward"] for k in ("conv1", "conv2")}
    frozen = dict(NET, layers=[dict(layer, param=[{"lr_mult": 0}, {"lr_mult": 0}]) if layer["name"] == "conv1" else layer
                               for layer in NET["layers"]])
    net = Net(frozen, phase="train", xp=xp)  # conv1 needs no backward: nothing asks for its gradients
    settle_apart(net)
    assert net.layer_dict["conv1"].engine_choice["backward"] is None
    assert None not in net.layer_dict["conv2"].engine_choice.values()
