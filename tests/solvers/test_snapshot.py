"""Snapshots: resume equals the uninterrupted run, atomic writes, starting from weights, restore errors."""
import os
import subprocess
import sys

import numpy
import pytest

from layerforge.errors import LayerforgeError
from layerforge.layers import LAYER_REGISTRY, Layer, register_layer
from layerforge.npz import load_npz
from layerforge.solvers import get_solver

from . import dataset

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if "TestCounterData" not in LAYER_REGISTRY:
    @register_layer("TestCounterData")
    class CounterData(Layer):
        """Batches that depend on a read position, which get_state/set_state save and restore (as Data does)."""

        num_bottom = (0, 0)
        num_top = (2, 2)
        has_backward = False
        X, Y = dataset(20, seed=11)

        def layer_setup(self, bottom, top):
            self.position = 0

        def reshape(self, bottom, top):
            top[0].reshape(3, 3)
            top[1].reshape(3, 2)

        def forward(self, bottom, top):
            rows = [(self.position + k) % len(self.X) for k in range(3)]
            top[0].data[...] = self.X[rows]
            top[1].data[...] = self.Y[rows]
            self.position += 3

        def get_state(self):
            return {"position": numpy.int64(self.position)}

        def set_state(self, state):
            self.position = int(state["position"])


NET = {"name": "resume", "layers": [
    {"name": "data", "type": "TestCounterData", "top": ["x", "y"]},
    {"name": "noise", "type": "DummyData", "top": ["noise"],
     "dummy_data": {"shape": [3, 3], "data_filler": {"type": "GAUSSIAN", "std": 0.1}}},
    {"name": "noisy", "type": "Eltwise", "bottom": ["x", "noise"], "top": ["noisy"]},
    {"name": "ip1", "type": "InnerProduct", "bottom": ["noisy"], "top": ["ip1"],
     "inner_product": {"num_output": 5, "weight_filler": {"type": "GAUSSIAN", "std": 0.5}}},
    {"name": "relu", "type": "ReLU", "bottom": ["ip1"], "top": ["ip1"]},
    {"name": "drop", "type": "Dropout", "bottom": ["ip1"], "top": ["ip1"]},
    {"name": "ip2", "type": "InnerProduct", "bottom": ["ip1"], "top": ["ip2"],
     "inner_product": {"num_output": 2, "weight_filler": {"type": "GAUSSIAN", "std": 0.5}}},
    {"name": "loss", "type": "EuclideanLoss", "bottom": ["ip2", "y"], "top": ["loss"]}]}


def make(tmp_path, seed=5, **keys):
    keys = {"net_param": NET, "base_lr": 0.05, "momentum": 0.9, "weight_decay": 0.001, "random_seed": seed,
            "test_iter": [2], "test_interval": 3, "snapshot": 5, "snapshot_prefix": str(tmp_path / "r"),
            "average_loss": 3, **keys}
    solver = get_solver(keys)
    losses = []
    solver.add_callback(lambda it, loss: losses.append(loss))
    return solver, losses


@pytest.mark.parametrize("rule", ["SGD", "Adam", "AdaDelta"])
def test_resume_equals_uninterrupted(tmp_path, rule):
    full, full_losses = make(tmp_path, type=rule)
    full.step(12)
    final = [p.data.copy() for p in full.net.learnable_params]
    # a different seed proves the restored stream, not the seed, makes the rest identical
    resumed, resumed_losses = make(tmp_path, seed=99, type=rule)
    resumed.restore(str(tmp_path / "r_iter_5.solverstate.npz"))
    assert resumed.iter == 5 and list(resumed.losses) == full_losses[2:5]
    assert resumed.net.layer_dict["data"].position == 15 and resumed.test_nets[0].layer_dict["data"].position == 12
    resumed.step(7)
    assert resumed_losses == full_losses[5:]
    for a, b in zip(resumed.net.learnable_params, final):
        assert numpy.array_equal(a.data, b)
    assert resumed.test_scores == full.test_scores


def test_solve_resume_file(tmp_path):
    full, full_losses = make(tmp_path, max_iter=8)
    full.solve()
    again, losses = make(tmp_path, seed=1, max_iter=8)
    again.solve(resume_file=str(tmp_path / "r_iter_5.solverstate.npz"))
    assert losses == full_losses[5:] and again.iter == 8
    assert os.path.exists(tmp_path / "r_iter_8.npz")  # snapshot_after_train


def test_snapshot_files(tmp_path):
    solver, _ = make(tmp_path, type="Adam")
    solver.step(5)
    weights = load_npz(tmp_path / "r_iter_5.npz")
    assert sorted(weights) == ["ip1/0", "ip1/1", "ip2/0", "ip2/1"]
    state = load_npz(tmp_path / "r_iter_5.solverstate.npz")
    assert int(state["iter"]) == 5 and state["type"].item() == "Adam"
    assert state["learned_net"].item() == "r_iter_5.npz"
    assert len([k for k in state if k.startswith("history/")]) == 8  # Adam: m and v per parameter
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_snapshot_prefix_is_relative_to_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver, _ = make(tmp_path, snapshot_prefix="out/lenet")
    assert solver.snapshot() == "out/lenet_iter_0.solverstate.npz"
    assert (tmp_path / "out" / "lenet_iter_0.npz").exists()


def test_failed_write_keeps_previous_snapshot(tmp_path, monkeypatch):
    solver, _ = make(tmp_path)
    solver.step(5)
    good = load_npz(tmp_path / "r_iter_5.npz")

    def broken_savez(f, **arrays):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(numpy, "savez", broken_savez)
    with pytest.raises(LayerforgeError, match="cannot write: disk full; any earlier file at this path is intact"):
        solver.snapshot()  # rewrites r_iter_5: the old file must survive
    solver.iter = 6
    with pytest.raises(LayerforgeError, match="disk full"):
        solver.snapshot()
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["r_iter_5.npz", "r_iter_5.solverstate.npz"]
    again = load_npz(tmp_path / "r_iter_5.npz")
    assert all(numpy.array_equal(good[k], again[k]) for k in good)
    fresh, _ = make(tmp_path)
    fresh.restore(str(tmp_path / "r_iter_5.solverstate.npz"))
    assert fresh.iter == 5


KILLED = """
import os, signal, sys, numpy
sys.path.insert(0, sys.argv[2])
from tests.solvers.test_snapshot import make
import pathlib
solver, _ = make(pathlib.Path(sys.argv[1]))
solver.step(5)
def killed(f, **arrays):
    f.write(b"PK\\x03\\x04 half a zip")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
numpy.savez = killed
solver.step(5)
"""


def test_killed_writer_leaves_previous_snapshot_loadable(tmp_path):
    child = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path), REPO], capture_output=True, text=True,
                           timeout=60, cwd=REPO)
    assert child.returncode == -9, child.stderr
    assert not (tmp_path / "r_iter_10.npz").exists()
    solver, _ = make(tmp_path)
    solver.restore(str(tmp_path / "r_iter_5.solverstate.npz"))
    assert solver.iter == 5


def test_weights_start(tmp_path):
    trained, _ = make(tmp_path)
    trained.step(5)
    start, _ = make(tmp_path, seed=3, weights=[str(tmp_path / "r_iter_5.npz")])
    assert start.iter == 0
    for a, b in zip(start.net.learnable_params, trained.net.learnable_params):
        assert numpy.array_equal(a.data, b.data)
    assert start.test_nets[0].params["ip1"][0].data is start.net.params["ip1"][0].data


def test_restore_errors(tmp_path):
    solver, _ = make(tmp_path)
    solver.step(5)
    with pytest.raises(LayerforgeError, match=r"not a solver state .*did you mean '.*r_iter_5.solverstate.npz'"):
        solver.restore(str(tmp_path / "r_iter_5.npz"))
    adam, _ = make(tmp_path, type="Adam")
    with pytest.raises(LayerforgeError, match=r"holds 4 history arrays \(SGD solver\) but this Adam solver has 8"):
        adam.restore(str(tmp_path / "r_iter_5.solverstate.npz"))
    with pytest.raises(LayerforgeError, match="no such file"):
        solver.restore(str(tmp_path / "missing.solverstate.npz"))


CONV_NET = {"name": "c", "layers": [
    {"name": "data", "type": "DummyData", "top": ["data", "label"],
     "dummy_data": {"shape": [[8, 3, 12, 12], [8]], "data_filler": [{"type": "gaussian"},
                                                                  {"type": "uniform", "min": 0, "max": 4}],
                    "integer": [False, True]}},
    {"name": "conv1", "type": "Convolution", "bottom": "data", "top": "conv1",
     "convolution": {"num_output": 6, "kernel_size": 3, "pad": 1, "weight_filler": {"type": "xavier"}}},
    {"name": "relu", "type": "ReLU", "bottom": "conv1", "top": "conv1"},
    {"name": "conv2", "type": "Convolution", "bottom": "conv1", "top": "conv2",
     "convolution": {"num_output": 5, "kernel_size": 3, "stride": 2, "weight_filler": {"type": "xavier"}}},
    {"name": "ip", "type": "InnerProduct", "bottom": "conv2", "top": "ip", "inner_product": {"num_output": 4}},
    {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]}


def test_resume_with_auto_engines_is_bit_identical(tmp_path):
    """AUTO times both engines before the first iteration; a snapshot keeps what it chose, so the resumed run uses
    the same engines (different engines round differently) and ends on the very same weights."""
    keys = dict(net_param=CONV_NET, base_lr=0.05, momentum=0.9, max_iter=12, snapshot=8, random_seed=5,
                snapshot_prefix=str(tmp_path / "a"), snapshot_after_train=True, display=0)
    whole = get_solver(keys)
    whole.solve()
    engines = whole.net.layers[1].engine_choice
    assert None not in engines.values()
    resumed = get_solver(dict(keys, snapshot_prefix=str(tmp_path / "b")))
    resumed.solve(resume_file=str(tmp_path / "a_iter_8.solverstate.npz"))
    assert resumed.net.layers[1].engine_choice == engines
    for name in whole.net.params:
        for a, b in zip(whole.net.params[name], resumed.net.params[name]):
            numpy.testing.assert_array_equal(a.data, b.data, err_msg=name)
