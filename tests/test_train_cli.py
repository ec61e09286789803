"""`layerforge train` (--snapshot, --weights, Ctrl-C) and `layerforge test` as a user runs them."""
import re
import signal
import subprocess
import sys
import time

import numpy
import pytest

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
    assert losses(resumed.stderr) == losses(full.stderr)[3:]


@pytest.mark.gpu  # its second half runs `layerforge test --gpu 0`, which its name does not say
def test_weights_then_test_command(tmp_path):
    trained = layerforge("train", "--solver", write_solver(tmp_path, 4))
    assert trained.returncode == 0, trained.stderr
    weights = tmp_path / "snap" / "lenet_iter_4.npz"
    tested = layerforge("test", "--model", "configs/lenet.yaml", "--weights", weights, "--iterations", 3)
    assert tested.returncode == 0, tested.stderr
    assert len(re.findall(r"Batch \d, accuracy = ", tested.stderr)) == 3
    mean = float(re.search(r"\] accuracy = ([\d.]+)", tested.stderr).group(1))
    batches = [float(v) for v in re.findall(r"Batch \d, accuracy = ([\d.]+)", tested.stderr)]
    assert abs(mean - numpy.mean(batches)) < 1e-6
    assert re.search(r"\] loss = [\d.]+ \(\* 1 = [\d.]+ loss\)", tested.stderr)
    # Caffe's `caffe test -gpu 0`: the same batches on the device (the emulated one without a GPU), same scores
    on_gpu = layerforge("test", "--model", "configs/lenet.yaml", "--weights", weights, "--iterations", 3, "--gpu", 0)
    assert on_gpu.returncode == 0, on_gpu.stderr
    cpu, gpu = (re.findall(r"Batch \d, (\w+) = ([\d.e+-]+)", log) for log in (tested.stderr, on_gpu.stderr))
    assert len(cpu) == 6 and [name for name, _ in gpu] == [name for name, _ in cpu]
    numpy.testing.assert_allclose([float(v) for _, v in gpu], [float(v) for _, v in cpu], rtol=1e-4)
    # fine-tuning starts from those weights: same seed and first batch as the run that wrote them, other loss
    tuned = layerforge("train", "--solver", write_solver(tmp_path, 1, name="tune.yaml"), "--weights", weights)
    assert tuned.returncode == 0, tuned.stderr
    assert losses(tuned.stderr)[0] != losses(trained.stderr)[0]
    fresh = layerforge("train", "--solver", write_solver(tmp_path, 1, name="fresh.yaml"))
    assert losses(fresh.stderr)[0] == losses(trained.stderr)[0]


@pytest.mark.parametrize("mode", ["THREADS", "REPLICAS", "AUTO"])
def test_ctrl_c_snapshots_and_exits_cleanly(tmp_path, mode):
    """Either way a CPU run goes (layerforge/dataparallel/cpu_parallel.py), the user sees one process: the choice
    and img/s in the log, Ctrl-C writes the snapshot and stops after one iteration, exit 0. AUTO (the default,
    here with an empty choice cache: a trial first) ends in one of the two."""
    forced = [] if mode == "AUTO" else ["--cpu-parallel", mode]
    proc = subprocess.Popen([sys.executable, "-m", "layerforge", "train", "--solver",
                             str(write_solver(tmp_path, 100000)), *forced], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    seen = ""
    while "Iteration 3 " not in seen and time.monotonic() < deadline:
        seen += proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    err = seen + err
    assert proc.returncode == 0, err
    assert "Optimization stopped early." in err
    snaps = list((tmp_path / "snap").glob("lenet_iter_*.solverstate.npz"))
    assert len(snaps) == 1
    assert "Traceback" not in err
    if mode == "AUTO":
        mode = re.search(r"CPU parallelism: (THREADS|REPLICAS), .* \(trial: [\d.]+ img/s with \d+ replicas, ", err)[1]
    else:
        assert f"(cpu_parallel: {mode})" in err
    how = "2 single-threaded replicas, each on 1/2 of the batch" if mode == "REPLICAS" else "one process on"
    assert f"CPU parallelism: {mode}, {how}" in err
    rates = [float(r) for r in re.findall(r"Iteration \d+ \([\d.e+]+ iter/s, [\d.e+]+s/1 iters, ([\d.]+) img/s\)", err)]
    assert len(rates) >= 3 and all(r > 0 for r in rates[1:])
    stopped = int(re.search(r"lenet_iter_(\d+)", snaps[0].name).group(1))
    assert stopped >= 3 and f"Iteration {stopped + 1} (" not in err  # (every replica) stopped after that one


def test_a_diverging_run_stops_with_one_processs_line_under_replicas(tmp_path):
    """A replica's error (here the non-finite loss of a rate that overflows) reaches the user as the one line one
    process prints, snapshot named: same text, same exit code, no worker named."""
    said = {}
    for mode in ("REPLICAS", "THREADS"):
        solver = write_solver(tmp_path, 5, snapshot=1, name=f"{mode}.yaml")
        solver.write_text(solver.read_text().replace("base_lr: 0.01", "base_lr: 1.0e+30"))
        proc = layerforge("train", "--solver", solver, "--cpu-parallel", mode)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        said[mode] = proc.stderr.strip().splitlines()[-1]
        assert (tmp_path / "snap" / "lenet_iter_1.solverstate.npz").exists()  # whole before any replica went on
    assert said["REPLICAS"] == said["THREADS"]
    assert said["THREADS"].startswith("error: iteration 1: loss is ")
    assert said["THREADS"].endswith(f"(the last good snapshot is {tmp_path}/snap/lenet_iter_1.solverstate.npz)")


def residual_net(batch=8):
    """A ReLU's output read by two convolutions (a Split the two make the sum of under shared storage)."""
    conv = {"num_output": 6, "kernel_size": 3, "pad": 1, "weight_filler": {"type": "msra"}}
    return {"name": "residual", "layers": [
        {"name": "data", "type": "DummyData", "top": ["data", "label"],
         "dummy_data": {"shape": [[batch, 3, 12, 12], [batch]],
                        "data_filler": [{"type": "gaussian", "std": 1.0}, {"type": "constant", "value": 1}]}},
        {"name": "conv1", "type": "Convolution", "bottom": "data", "top": "conv1", "convolution": conv},
        {"name": "relu1", "type": "ReLU", "bottom": "conv1", "top": "conv1"},
        {"name": "conv2a", "type": "Convolution", "bottom": "conv1", "top": "conv2a", "convolution": conv},
        {"name": "conv2b", "type": "Convolution", "bottom": "conv1", "top": "conv2b", "convolution": conv},
        {"name": "sum", "type": "Eltwise", "bottom": ["conv2a", "conv2b"], "top": "sum"},
        {"name": "ip", "type": "InnerProduct", "bottom": "sum", "top": "ip",
         "inner_product": {"num_output": 4, "weight_filler": {"type": "xavier"}}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]}


def mebibytes(text):
    value, unit = text.split()
    return float(value.replace(",", "")) * {"B": 2 ** -20, "KiB": 2 ** -10, "MiB": 1, "GiB": 2 ** 10}[unit]


@pytest.mark.parametrize("mode", ["THREADS", "REPLICAS"])
def test_train_shares_activation_storage_unless_told_not_to(tmp_path, mode):
    """layerforge train's nets share their activations' storage (as layerforge time's): the log says how much
    against each in its own, and the run (the Split's consumers make its sum), its tests included, is --no-reuse's
    to float rounding."""
    import json

    (tmp_path / "net.yaml").write_text(json.dumps(residual_net()))
    runs = {}
    for name, flags in (("shared", ()), ("own", ("--no-reuse",))):
        solver = tmp_path / f"{name}.yaml"
        solver.write_text(SOLVER.format(net=tmp_path / "net.yaml", max_iter=4, snapshot=0,
                                        prefix=tmp_path / name / "residual").replace("test_interval: 1000",
                                                                                      "test_interval: 2"))
        runs[name] = layerforge("train", "--solver", solver, "--cpu-parallel", mode, *flags)
        assert runs[name].returncode == 0, runs[name].stderr
    said = re.search(r"residual TRAIN: activations (\S+ \S+) in shared storage \((\S+ \S+) each in its own\)",
                     runs["shared"].stderr)
    assert "residual TEST: activations" in runs["shared"].stderr
    assert said and mebibytes(said.group(1)) < mebibytes(said.group(2)), runs["shared"].stderr
    assert "in shared storage" not in runs["own"].stderr
    shared, own = (losses(runs[k].stderr) for k in ("shared", "own"))
    assert len(shared) == 4 and shared[0] > shared[-1]
    numpy.testing.assert_allclose(shared, own, rtol=1e-5)
    tested = [[float(v) for v in re.findall(r"Test net output #0: loss = ([-\d.e+]+)", runs[k].stderr)]
              for k in ("shared", "own")]
    assert len(tested[0]) == 2  # at iterations 2 and 4
    numpy.testing.assert_allclose(*tested, rtol=1e-5)
    weights = [numpy.load(tmp_path / k / "residual_iter_4.npz") for k in ("shared", "own")]
    for key in weights[1].files:
        numpy.testing.assert_allclose(weights[0][key], weights[1][key], rtol=1e-4, atol=1e-6, err_msg=key)


def test_missing_weights_file_is_one_line(tmp_path):
    proc = layerforge("test", "--model", "configs/lenet.yaml", "--weights", tmp_path / "none.npz")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path / 'none.npz'}: no such file"


def test_status_lines_with_rate_and_eta_when_not_a_terminal(tmp_path):
    proc = layerforge("train", "--solver", write_solver(tmp_path, 4), "--status-interval", 0)
    assert proc.returncode == 0, proc.stderr
    status = re.findall(r"\] Progress: iteration (\d)/4 \(\d+%\), [\d.e+]+ iter/s, ETA (\d+:\d\d:\d\d), loss = ", proc.stderr)
    assert [int(i) for i, _ in status] == [1, 2, 3, 4]
    assert status[-1][1] == "0:00:00"
    assert proc.stdout == ""  # logs go to stderr, as glog's do
    quiet = layerforge("train", "--solver", write_solver(tmp_path, 2, name="quiet.yaml"), "--no-progress",
                       "--status-interval", 0)
    assert "Progress:" not in quiet.stderr


def test_progress_bar_on_a_terminal_keeps_log_lines_whole(tmp_path):
    import os
    import pty

    solver = write_solver(tmp_path, 6)
    pid, fd = pty.fork()
    if pid == 0:  # the child: layerforge with an 80x24 terminal as stdout and stderr
        import fcntl
        import struct
        import termios

        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "-m", "layerforge", "train", "--solver", str(solver)])
    chunks = []
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    screen = b"".join(chunks).decode(errors="replace")
    assert re.search(r"\d+/6 \[\d\d:\d\d<\d\d:\d\d", screen), screen[-2000:]  # tqdm: count, elapsed<ETA
    assert "iter/s" in screen
    # every log line starts at the beginning of a line of its own, whatever the bar drew before it
    for line in re.split(r"[\r\n]+", screen):
        if "solver.py:" in line and "] Iteration" in line:
            assert re.match(r"(\x1b\[A)?I\d{4} ", line), repr(line)


@pytest.mark.parametrize("value, count, want", [("3", 2, (3, None)), ("0,1", 2, (None, "0,1")), ("all", 2, (None, "0,1")),
                                                ("all", 1, (0, None)), ("ALL", 3, (None, "0,1,2"))])
def test_gpu_takes_caffes_forms(monkeypatch, value, count, want):
    """Caffe's -gpu: one device, a list (data parallel, as --devices) or all of them."""
    import argparse

    from layerforge import backend
    from layerforge.commands import train

    monkeypatch.setattr(backend, "gpu_count", lambda what="": count)
    args = argparse.Namespace(gpu=train.gpu_list(value), devices=None)
    train.resolve_gpu_list(args)
    assert (args.gpu, args.devices) == want


def test_bad_gpu_values_are_one_line(tmp_path):
    for value, message in (("x", "'x': give a GPU number, a list such as 0,1, or all"),
                           ("-1", "'-1': GPU numbers are not negative")):
        proc = layerforge("train", "--solver", "configs/lenet_solver.yaml", "--gpu", value)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr
    proc = layerforge("train", "--solver", "configs/lenet_solver.yaml", "--gpu", "0,1", "--devices", "0,1")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "error: --gpu 0,1 and --devices 0,1: give the devices once"


STAGED = """\
name: staged
layers:
  - {name: input, type: Input, top: [data, label], input: {shape: [[4, 1, 12, 12], [4]]}}
  - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product: {num_output: 3, weight_filler: {type: xavier}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
  - {name: doubled, type: Power, bottom: loss, top: doubled, power: {scale: 2}, include: [{stage: [extra]}]}
  - {name: tripled, type: Power, bottom: loss, top: tripled, power: {scale: 3}, include: [{min_level: 2}]}
"""


def test_level_and_stage_choose_the_layers_as_caffes_flags_do(tmp_path):
    """Caffe's -level / -stage: the NetState that include rules read, for train (its train_state), test and time."""
    (tmp_path / "net.yaml").write_text(STAGED)
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.01\nmax_iter: 1\ndisplay: 1\nsnapshot_prefix: "
                                          f"{tmp_path / 's'}\nsolver_mode: CPU\n")
    trained = layerforge("train", "--solver", tmp_path / "solver.yaml", "--stage", "extra")
    assert trained.returncode == 0, trained.stderr
    assert "doubled = " in trained.stderr and "tripled = " not in trained.stderr
    weights = tmp_path / "s_iter_1.npz"
    for flags, outputs in (([], set()), (["--stage", "extra"], {"doubled"}), (["--level", "2"], {"tripled"}),
                           (["--level", "2", "--stage", "other,extra"], {"doubled", "tripled"})):
        tested = layerforge("test", "--model", tmp_path / "net.yaml", "--weights", weights, "--iterations", 1, *flags)
        assert tested.returncode == 0, tested.stderr
        assert {name for name in ("doubled", "tripled") if f"] {name} = " in tested.stderr} == outputs, flags
    timed = layerforge("time", "--model", tmp_path / "net.yaml", "--phase", "test", "--iterations", 1, "--stage", "extra")
    assert timed.returncode == 0, timed.stderr
    assert "doubled" in timed.stdout + timed.stderr and "tripled" not in timed.stdout + timed.stderr
