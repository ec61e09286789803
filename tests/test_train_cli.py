"""`layerforge train` (--snapshot, --weights, Ctrl-C) and `layerforge test` as a user runs them."""
import re
import signal
import subprocess
import sys
import time

import numpy

from tests.test_cli import ROOT

SOLVER = """\
net: {net}
type: SGD
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
max_iter: {max_iter}
display: 1
test_iter: 2
test_interval: 1000
test_initialization: false
snapshot: {snapshot}
snapshot_prefix: {prefix}
random_seed: 3
"""


def write_solver(tmp_path, max_iter, snapshot=0, name="solver.yaml"):
    path = tmp_path / name
    path.write_text(SOLVER.format(net=ROOT / "configs" / "lenet.yaml", max_iter=max_iter, snapshot=snapshot,
                                  prefix=tmp_path / "snap" / "lenet"))
    return path


def layerforge(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "layerforge", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def losses(log):
    return [float(v) for v in re.findall(r"Iteration \d+ \(.*\), loss = ([-\d.e+]+)", log)]


def test_resume_from_snapshot_continues_the_same_run(tmp_path):
    full = layerforge("train", "--solver", write_solver(tmp_path, 6, snapshot=3))
    assert full.returncode == 0, full.stderr
    resumed = layerforge("train", "--solver", write_solver(tmp_path, 6, name="again.yaml"),
                         "--snapshot", tmp_path / "snap" / "lenet_iter_3.solverstate.npz")
    assert resumed.returncode == 0, resumed.stderr
    assert losses(resumed.stdout) == losses(full.stdout)[3:]


def test_weights_then_test_command(tmp_path):
    trained = layerforge("train", "--solver", write_solver(tmp_path, 4))
    assert trained.returncode == 0, trained.stderr
    weights = tmp_path / "snap" / "lenet_iter_4.npz"
    tested = layerforge("test", "--model", "configs/lenet.yaml", "--weights", weights, "--iterations", 3)
    assert tested.returncode == 0, tested.stderr
    assert len(re.findall(r"Batch \d, accuracy = ", tested.stdout)) == 3
    mean = float(re.search(r"\] accuracy = ([\d.]+)", tested.stdout).group(1))
    batches = [float(v) for v in re.findall(r"Batch \d, accuracy = ([\d.]+)", tested.stdout)]
    assert abs(mean - numpy.mean(batches)) < 1e-6
    assert re.search(r"\] loss = [\d.]+ \(\* 1 = [\d.]+ loss\)", tested.stdout)
    # fine-tuning starts from those weights: same seed and first batch as the run that wrote them, other loss
    tuned = layerforge("train", "--solver", write_solver(tmp_path, 1, name="tune.yaml"), "--weights", weights)
    assert tuned.returncode == 0, tuned.stderr
    assert losses(tuned.stdout)[0] != losses(trained.stdout)[0]
    fresh = layerforge("train", "--solver", write_solver(tmp_path, 1, name="fresh.yaml"))
    assert losses(fresh.stdout)[0] == losses(trained.stdout)[0]


def test_ctrl_c_snapshots_and_exits_cleanly(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "layerforge", "train", "--solver",
                             str(write_solver(tmp_path, 100000))], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    seen = ""
    while "Iteration 3 " not in seen and time.monotonic() < deadline:
        seen += proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Optimization stopped early." in out
    snaps = list((tmp_path / "snap").glob("lenet_iter_*.solverstate.npz"))
    assert len(snaps) == 1
    assert "Traceback" not in err


def test_missing_weights_file_is_one_line(tmp_path):
    proc = layerforge("test", "--model", "configs/lenet.yaml", "--weights", tmp_path / "none.npz")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path / 'none.npz'}: no such file"
