"""Nets on the GPU (a device, or the emulated one: tests/conftest.py) follow the CPU.

A Caffe net whose layers run the CUDA kernels (convolution, pooling, LRN, BatchNorm): the prototxt converts and
builds on numpy; with the ``xp`` fixture's cupy the same net with the same weights must give the same loss and
gradients (float64, 1e-10). ``layerforge train --gpu 0`` logs the losses of the CPU run, and ``layerforge time --gpu
0`` times every layer on the device.
"""
import json
import re
import subprocess
import sys

import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.net import Net
from tests.test_cli import ROOT

PROTOTXT = """name: "kernels"
layer { name: "data" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 2 dim: 3 dim: 9 dim: 9 } shape { dim: 2 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "norm1" type: "LRN" bottom: "conv1" top: "norm1" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 } }
layer { name: "pool1" type: "Pooling" bottom: "norm1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 4 kernel_size: 2 group: 2 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: AVE kernel_size: 2 stride: 1 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool2" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def run(path, xp, weights, data, label):
    net = Net(str(path), phase="TRAIN", dtype="float64", xp=xp)
    for name, blobs in weights.items():
        for blob, value in zip(net.params[name], blobs):
            blob.data[...] = xp.asarray(value)
    net.forward(data=xp.asarray(data), label=xp.asarray(label))
    net.clear_param_diffs()
    net.backward()
    return float(to_numpy(net.blobs["loss"].data)), {
        name: [to_numpy(b.diff).copy() for b in blobs] for name, blobs in net.params.items()}


def test_caffe_net_on_the_kernels_agrees(tmp_path, xp):
    from layerforge.solvers.caffe_import import convert_file

    path = tmp_path / "kernels.prototxt"
    path.write_text(PROTOTXT)
    kind, mapping, notes = convert_file(path)
    assert [layer["type"] for layer in mapping["layers"]][1:5] == ["Convolution", "BatchNorm", "LRN", "Pooling"]
    reference = Net(str(path), phase="TRAIN", dtype="float64")
    weights = {name: [b.data.copy() for b in blobs] for name, blobs in reference.params.items()}
    rng = numpy.random.default_rng(0)
    data, label = rng.normal(size=(2, 3, 9, 9)), numpy.array([0.0, 2.0])
    loss, grads = run(path, numpy, weights, data, label)
    assert numpy.isfinite(loss) and loss > 0
    assert all(numpy.abs(g).sum() > 0 for g in grads["conv1"])  # the gradient reached the first layer
    loss_xp, grads_xp = run(path, xp, weights, data, label)
    assert loss_xp == pytest.approx(loss, rel=1e-10)
    for name, diffs in grads.items():
        for got, want in zip(grads_xp[name], diffs):
            numpy.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=name)


def test_time_on_the_gpu_reports_device_times():
    proc = subprocess.run([sys.executable, "-m", "layerforge", "time", "--model", "configs/lenet.yaml", "--gpu", "0",
                           "--iterations", "3", "--batch", "8", "--json"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["device"] and result["device_pool_bytes"] > 0
    rows = {r["layer"]: r for r in result["layers"]}
    for name in ("conv1", "conv2", "ip1", "loss"):
        assert rows[name]["forward_ms"] > 0 and rows[name]["backward_ms"] > 0, name
    assert set(rows["conv2"]["engine"].split("/")) <= {"IM2COL", "IMPLICIT"}  # AUTO settled on CUDA-event times


# the losses train logs: "Iteration 3 (...), loss = 1.89715" and "Test net output #1: loss = 2.36233 (...)"
LOGGED_LOSS = re.compile(r"\] (Iteration \d+) \(.*\), loss = (\S+)$|\] +(Test net output #\d+: \w+) = (\S+)")


def logged_losses(log):
    """``{what: value}`` of every loss and test output a training log shows."""
    found = {}
    for line in log.splitlines():
        m = LOGGED_LOSS.search(line)
        if m:
            found[m.group(1) or m.group(3)] = float(m.group(2) or m.group(4))
    return found


# iterations the train command runs in CI (AUTO settles its engines before the first, on each device; other
# choices round differently, within the tolerance); docs/gpu.md records the 50 of issue 33
TRAIN_ITERATIONS = 6


def test_train_on_the_gpu_logs_the_losses_of_the_cpu_run(tmp_path):
    """``layerforge train --solver configs/lenet_solver.yaml --gpu 0`` (logging every iteration, testing on one batch)
    logs the losses the same command logs with ``--cpu``, from the same seed: float32, to 1e-5."""
    text = (ROOT / "configs" / "lenet_solver.yaml").read_text()
    # the test at iteration 0 on one batch of 100 digits, not 10: the outputs compared are the same, at a tenth the cost
    for key, value in (("net", ROOT / "configs" / "lenet.yaml"), ("display", 1), ("test_iter", 1),
                       ("snapshot_prefix", tmp_path / "lenet")):
        text, found = re.subn(rf"^{key}: .*$", f"{key}: {value}", text, flags=re.M)
        assert found == 1, key
    (tmp_path / "solver.yaml").write_text(text)
    logs = {}
    for device in (["--gpu", "0"], ["--cpu"]):
        proc = subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver", "solver.yaml", *device,
                               "--max-iter", str(TRAIN_ITERATIONS), "--no-progress"], capture_output=True, text=True,
                              cwd=tmp_path, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        logs[device[0]] = proc.stderr
    assert "Using GPU 0: " in logs["--gpu"] and "Using GPU" not in logs["--cpu"]
    cpu, gpu = logged_losses(logs["--cpu"]), logged_losses(logs["--gpu"])
    assert len(cpu) == TRAIN_ITERATIONS + 2 and set(gpu) == set(cpu)  # each iteration and the test at iteration 0
    assert cpu["Iteration 0"] > 2 and cpu[f"Iteration {TRAIN_ITERATIONS - 1}"] < cpu["Iteration 0"]  # it learns
    assert gpu == pytest.approx(cpu, rel=1e-5)


def small_resnet():
    from tests.net.test_fusion import resnet_block
    return dict(net_param=resnet_block(True), base_lr=0.1, momentum=0.9, weight_decay=1e-4, random_seed=2)


def lenet():
    """configs/lenet_solver.yaml with its net at batch 16 (small shapes for the emulated device)."""
    import yaml

    solver = yaml.safe_load((ROOT / "configs" / "lenet_solver.yaml").read_text())
    net = yaml.safe_load((ROOT / "configs" / solver.pop("net")).read_text())
    for layer in net["layers"]:
        if layer["type"] == "Data":
            layer["data"]["batch_size"] = 16
    return dict(solver, net_param=net)


@pytest.mark.parametrize("make", [lenet, small_resnet])
def test_twenty_iterations_on_the_gpu_follow_the_cpu(make):
    from layerforge import get_solver
    from tests.solvers.test_cuda_graph import pinned

    runs = []
    for mode in ("CPU", "GPU"):
        # the convolutions on IM2COL, named: AUTO's engine trials (CUDA-event timing on the device) are not what
        # this compares, and cost a third of the run
        made = make()
        solver = get_solver(dict(made, net_param=pinned(made["net_param"])), solver_mode=mode, max_iter=20,
                            average_loss=20, dtype="float64", display=0, test_interval=0, snapshot=0,
                            snapshot_after_train=False)
        solver.solve()
        runs.append(solver)
    cpu, gpu = runs
    assert gpu.net.xp.__name__ == "cupy" and len(cpu.losses) == 20
    assert list(gpu.losses) == pytest.approx(list(cpu.losses), rel=1e-8)
    for name, blobs in cpu.net.params.items():
        for j, b in enumerate(blobs):
            numpy.testing.assert_allclose(to_numpy(gpu.net.params[name][j].data), b.data, rtol=1e-7, atol=1e-10,
                                          err_msg=f"{name}/{j}")
