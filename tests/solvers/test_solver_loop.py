"""The loop: iter_size accumulation, hooks, test nets, Caffe log lines, NaN stop and signals."""
import os
import re
import signal
import subprocess
import sys

import numpy
import pytest

from layerforge.npz import load_npz
from layerforge.solvers import NonFiniteError, get_solver
from layerforge.solvers.seam import Seam

from . import dataset, fed_solver, linear_grads, linear_net

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def params_of(solver):
    return [p.data.copy() for p in solver.net.learnable_params]


@pytest.mark.parametrize("rule", ["SGD", "Adam"])
def test_iter_size_equals_big_batch_fed(rule):
    # with clipping, only clip_after_normalize keeps the equivalence (Caffe clips the sum of the passes)
    x, y = dataset(32)
    keys = {"type": rule, "base_lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "clip_gradients": 0.5,
            "clip_after_normalize": True}
    small = fed_solver(x, y, 2, iter_size=4, **keys)
    big = fed_solver(x, y, 8, **keys)
    small.step(3)
    big.step(3)
    for a, b in zip(params_of(small), params_of(big)):
        numpy.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def dummy_net(batch):
    return {"layers": [
        {"name": "data", "type": "DummyData", "top": ["x", "y"],
         "dummy_data": {"shape": [[batch, 3], [batch, 2]],
                        "data_filler": [{"type": "GAUSSIAN"}, {"type": "CONSTANT", "value": 0.5}]}},
        {"name": "ip", "type": "InnerProduct", "bottom": ["x"], "top": ["ip"],
         "inner_product": {"num_output": 2, "weight_filler": {"type": "GAUSSIAN", "std": 0.5}}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["ip", "y"], "top": ["loss"]}]}


def test_iter_size_equals_big_batch_dummy_data():
    # DummyData draws its batch from the process stream: 4 draws of (2, 3) are one draw of (8, 3)
    keys = {"base_lr": 0.1, "momentum": 0.9, "dtype": "float64", "random_seed": 3}
    small = get_solver({"net_param": dummy_net(2), "iter_size": 4, **keys})
    small.step(4)  # before the second solver re-seeds the process stream
    big = get_solver({"net_param": dummy_net(8), **keys})
    big.step(4)
    for a, b in zip(params_of(small), params_of(big)):
        numpy.testing.assert_allclose(a, b, rtol=1e-12)


def test_gradient_hook_sees_summed_diffs_before_the_update():
    x, y = dataset(8)
    seen = []
    solver = fed_solver(x, y, 4, base_lr=0.1, iter_size=2)
    w = solver.net.learnable_params[0].data.copy()

    class SecondRank(Seam):
        def before_update(self):
            seen.append(solver.net.learnable_params[0].diff.copy())
            for p in solver.net.learnable_params:
                p.diff *= 2  # as if a second rank contributed the same gradient
            return True

    solver.add_seam(SecondRank())
    b = solver.net.learnable_params[1].data.copy()
    solver.step(1)
    gw = sum(linear_grads(w, b, x[i:i + 4], y[i:i + 4])[0] for i in (0, 4))
    assert len(seen) == 1
    numpy.testing.assert_allclose(seen[0], gw, rtol=1e-12)  # summed over the passes, not yet normalised
    # the update used (hooked sum / iter_size) = twice the mean gradient
    numpy.testing.assert_allclose(w - solver.net.learnable_params[0].data, 0.1 * gw, rtol=1e-12)


def test_callbacks_get_iteration_and_mean_loss():
    x, y = dataset(8)
    solver = fed_solver(x, y, 4, base_lr=0.0, iter_size=2)
    calls = []
    solver.add_callback(lambda it, loss: calls.append((it, loss)))
    solver.step(2)
    w, b = (p.data for p in solver.net.learnable_params)
    losses = [((x[i:i + 4] @ w.T + b - y[i:i + 4]) ** 2).sum() / 8 for i in (0, 4)]
    assert [c[0] for c in calls] == [0, 1]
    assert calls[0][1] == pytest.approx(sum(losses) / 2, rel=1e-12)


def test_test_nets_share_weights_and_average_scores():
    solver = get_solver({"net_param": dummy_net(4), "test_iter": [3], "test_interval": 1, "random_seed": 2,
                         "base_lr": 0.1, "dtype": "float64"})
    train_ip, test_ip = solver.net.params["ip"][0], solver.test_nets[0].params["ip"][0]
    assert test_ip.data is train_ip.data
    tn, seen = solver.test_nets[0], []
    forward = tn.forward

    def recording_forward(*a, **k):
        out = forward(*a, **k)
        seen.append(tn.loss)
        return out

    tn.forward = recording_forward
    solver.step(2)  # tests at iteration 0 and 1
    assert len(seen) == 6
    assert solver.test_scores[0]["loss"] == pytest.approx(numpy.mean(seen[3:]), rel=1e-12)
    assert test_ip.data is solver.net.params["ip"][0].data


def test_caffe_log_lines(tmp_path, caplog):
    x, y = dataset(8)
    solver = fed_solver(x, y, 4, net=linear_net(4), base_lr=0.1, display=2, max_iter=4, test_iter=[2],
                        test_interval=2, snapshot=4, snapshot_prefix=str(tmp_path / "lin"), average_loss=2)
    with caplog.at_level("INFO", logger="layerforge"):
        solver.solve()
    lines = [r.getMessage() for r in caplog.records]
    num = r"-?[\d.]+(e[+-]\d+)?"
    patterns = [
        r"Iteration 0, Testing net \(#0\)",
        rf"    Test net output #0: loss = {num} \(\* 1 = {num} loss\)",
        rf"Iteration 0 \({num} iter/s, {num}s/2 iters, 0.0 img/s\), loss = {num}",  # 0 at the start, as iter/s
        rf"    Train net output #0: loss = {num} \(\* 1 = {num} loss\)",
        r"Iteration 0, lr = 0.1",
        rf"Iteration 2 \({num} iter/s, {num}s/2 iters, {num} img/s\), loss = {num}",
        f"Snapshotting to {re.escape(str(tmp_path / 'lin'))}_iter_4.npz",
        rf"Iteration 4, loss = {num}",
        r"Iteration 4, Testing net \(#0\)",
        r"Optimization Done.",
    ]
    for pattern in patterns:
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, lines)
    # img/s = iter/s x the batch (4 images a pass here)
    rate = next(re.search(rf"\((?P<iters>{num}) iter/s, {num}s/2 iters, (?P<images>{num}) img/s\)", line)
                for line in lines if line.startswith("Iteration 2 ("))
    assert float(rate["images"]) == pytest.approx(4 * float(rate["iters"]), rel=1e-3, abs=0.06)


def test_display_loss_is_mean_over_average_loss(caplog):
    x, y = dataset(16)
    solver = fed_solver(x, y, 4, base_lr=0.1, display=3, average_loss=2)
    losses = []
    solver.add_callback(lambda it, loss: losses.append(loss))
    with caplog.at_level("INFO", logger="layerforge"):
        solver.step(4)
    shown = [float(r.getMessage().rsplit("= ", 1)[1]) for r in caplog.records
             if r.getMessage().startswith("Iteration 3 (")]
    assert shown == [pytest.approx((losses[2] + losses[3]) / 2, rel=1e-5)]


def test_nan_loss_stops_naming_iteration_and_layer(tmp_path):
    x, y = dataset(4)
    solver = fed_solver(x, y, 4, base_lr=0.01, snapshot=1, snapshot_prefix=str(tmp_path / "s"), max_iter=10)
    feed = solver.feed
    solver.feed = lambda it, k: {"x": x * 1e200, "y": y} if it == 2 else feed(it, k)
    with pytest.raises(NonFiniteError) as e, numpy.errstate(over="ignore"):
        solver.solve()
    msg = str(e.value)
    assert msg.startswith("iteration 2: loss is inf; first layer with a non-finite output: 'loss' (EuclideanLoss)")
    assert msg.endswith(f"the last good snapshot is {tmp_path / 's'}_iter_2.solverstate.npz)")
    assert sorted(os.listdir(tmp_path)) == ["s_iter_1.npz", "s_iter_1.solverstate.npz",
                                            "s_iter_2.npz", "s_iter_2.solverstate.npz"]


def test_non_finite_weights_are_never_snapshotted(tmp_path):
    x, y = dataset(4)
    # a finite rate that overflows float32 weights in the first update (an infinite one is refused by the schema)
    solver = fed_solver(x, y, 4, base_lr=1e300, snapshot=1, snapshot_prefix=str(tmp_path / "s"), max_iter=5,
                        dtype="float32")
    with pytest.raises(NonFiniteError) as e:
        solver.solve()
    assert str(e.value).startswith("iteration 1: the parameters of layer 'ip' (InnerProduct) became non-finite")
    assert os.listdir(tmp_path) == []


CHILD = """
import logging, sys, time
import layerforge.solvers as S
logging.basicConfig(level=logging.INFO, format="%(message)s")
s = S.get_solver(sys.argv[1], snapshot_prefix=sys.argv[2], max_iter=int(sys.argv[3]))
def tick(it, loss):
    print("iter", it, flush=True)
    time.sleep(0.01)
s.add_callback(tick)
s.solve(sigint_effect="stop", sighup_effect="snapshot")
print("done", s.iter, flush=True)
"""

SOLVER = """
net_param:
  layers:
    - {name: data, type: DummyData, top: [x, y], dummy_data: {shape: [[4, 3], [4, 2]], data_filler: {type: GAUSSIAN}}}
    - {name: ip, type: InnerProduct, bottom: [x], top: [ip], inner_product: {num_output: 2}}
    - {name: loss, type: EuclideanLoss, bottom: [ip, y], top: [loss]}
base_lr: 0.01
random_seed: 1
"""


def run_child(tmp_path, sig, max_iter):
    (tmp_path / "solver.yaml").write_text(SOLVER)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    prefix = str(tmp_path / "snap")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "solver.yaml"), prefix, str(max_iter)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in child.stdout:
        if line.strip() == "iter 2":
            child.send_signal(sig)
            break
    out, err = child.communicate(timeout=30)
    done = [l for l in out.splitlines() if l.startswith("done")]
    return child.returncode, int(done[0].split()[1]) if done else None, err, prefix


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_snapshots_then_exits_cleanly(tmp_path, sig):
    rc, stopped_at, err, prefix = run_child(tmp_path, sig, 100000)
    assert rc == 0, err
    assert 3 <= stopped_at < 1000
    assert "Optimization stopped early." in err
    state = load_npz(f"{prefix}_iter_{stopped_at}.solverstate.npz")
    assert int(state["iter"]) == stopped_at and os.path.exists(f"{prefix}_iter_{stopped_at}.npz")


def test_sighup_snapshots_and_goes_on(tmp_path):
    rc, stopped_at, err, prefix = run_child(tmp_path, signal.SIGHUP, 40)
    assert rc == 0, err
    assert stopped_at == 40 and "Optimization Done." in err
    snaps = sorted(f for f in os.listdir(tmp_path) if f.endswith(".solverstate.npz"))
    assert len(snaps) == 2 and "snap_iter_40.solverstate.npz" in snaps


def test_solver_states_merge_into_the_nets_own_state():
    # Caffe's InitTrainNet / InitTestNets: the net's state, then train_state / test_state merged over it
    net = linear_net()
    net["state"] = {"level": 2, "stage": ["base"]}
    net["layers"].append({"name": "deep", "type": "Power", "bottom": "ip", "top": "deep",
                          "include": {"min_level": 2, "stage": ["base", "extra"]}})
    plain = get_solver({"net_param": net, "test_iter": [1]})
    assert (plain.net.level, plain.net.stages) == (2, ("base",))
    assert "deep" not in plain.net.layer_dict  # needs stage 'extra' too
    merged = get_solver({"net_param": net, "test_iter": [1], "train_state": {"stage": ["extra"]},
                         "test_state": [{"level": 0, "stage": ["extra"]}]})
    assert (merged.net.phase, merged.net.level, merged.net.stages) == ("TRAIN", 2, ("base", "extra"))
    assert "deep" in merged.net.layer_dict
    tn = merged.test_nets[0]
    assert (tn.phase, tn.level) == ("TEST", 0) and "deep" not in tn.layer_dict
