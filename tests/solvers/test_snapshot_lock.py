"""Two runs never write snapshots under one prefix: the second is refused in one line naming the first; a lock that
a dead run left is taken over with a warning (layerforge/solvers/snapshot_lock.py)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from layerforge.errors import LayerforgeError
from layerforge.solvers import snapshot_lock
from tests.test_train_cli import ROOT, write_solver


def train(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "layerforge", "train", *map(str, args)], cwd=ROOT, text=True,
                            **kwargs)


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_run_with_the_same_prefix_is_refused_naming_the_first(tmp_path):
    first_solver = write_solver(tmp_path, 100000, snapshot=50000, name="first.yaml")
    second_solver = write_solver(tmp_path, 2, snapshot=1, name="second.yaml")
    log = open(tmp_path / "first.log", "w+")
    first = train("--solver", first_solver, "--cpu-parallel", "THREADS", stderr=log)
    try:
        deadline = time.time() + 120
        while "Iteration 1 " not in (tmp_path / "first.log").read_text():  # training, so holding the lock
            assert first.poll() is None and time.time() < deadline, (tmp_path / "first.log").read_text()
            time.sleep(0.2)
        second = subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver", str(second_solver)],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr
        last = second.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: {second_solver}: snapshot_prefix '{tmp_path / 'snap' / 'lenet'}': another "
                               f"run writes snapshots under this prefix (host {socket.gethostname()}, "
                               f"pid {first.pid}, solver {first_solver}, started "), last
        assert "Iteration 0" not in second.stderr
        assert not list((tmp_path / "snap").glob("lenet_iter_*"))  # the second wrote nothing
        assert first.poll() is None  # and the first goes on
    finally:
        first.send_signal(signal.SIGTERM)  # stops with its final snapshot, then lets the lock go
        first.wait(timeout=120)
        log.close()
    assert first.returncode == 0, (tmp_path / "first.log").read_text()
    assert not (tmp_path / "snap" / "lenet.lock").exists()
    again = subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver", str(second_solver)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "snapshot lock" not in again.stderr, again.stderr


def test_a_lock_left_by_a_dead_run_is_taken_over_with_a_warning(tmp_path):
    solver = write_solver(tmp_path, 2, snapshot=1)
    (tmp_path / "snap").mkdir()
    pid = dead_pid()
    lock = tmp_path / "snap" / "lenet.lock"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "solver": "/elsewhere/old.yaml",
                                "started": 0}))
    proc = subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver", str(solver)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "Taking over the snapshot lock" in line]
    assert len(warned) == 1 and warned[0].startswith("W")
    assert warned[0].endswith(f"Taking over the snapshot lock {lock} of a run that is gone (host "
                              f"{socket.gethostname()}, pid {pid}, solver /elsewhere/old.yaml, started "
                              f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(0))})"), warned[0]
    assert (tmp_path / "snap" / "lenet_iter_2.npz").exists() and not lock.exists()


def test_a_lock_held_by_the_children_of_a_dead_run_is_taken_over(tmp_path):
    # a run killed by SIGKILL whose forked helpers still hold the flock: its pid is gone from this host
    prefix, pid = str(tmp_path / "p"), dead_pid()
    path = snapshot_lock.lock_path(prefix)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"host": socket.gethostname(), "pid": pid, "solver": "s.yaml"}).encode())
    held = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(fd,))
    os.close(fd)  # the child alone holds it now (a live pid, but not the one in the file)
    try:
        with snapshot_lock.acquire(prefix, "mine.yaml", "solver.yaml: snapshot_prefix"):
            assert json.loads(open(path).read())["pid"] == os.getpid()
        assert not os.path.exists(path)
    finally:
        held.kill()
        held.wait()


def test_the_lock_of_a_live_process_refuses_and_is_released_on_error(tmp_path):
    prefix = str(tmp_path / "p")
    script = (f"from layerforge.solvers import snapshot_lock\n"
              f"lock = snapshot_lock.acquire({prefix!r}, 'other.yaml', 'x')\n"
              "print('held', flush=True)\ninput()\n")
    other = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert other.stdout.readline() == "held\n"
        with pytest.raises(LayerforgeError, match=rf"^solver.yaml: snapshot_prefix '{prefix}': another run writes "
                                                  rf"snapshots under this prefix \(host .*, pid {other.pid}, solver "
                                                  rf".*other.yaml, started .*\); give this run another"):
            snapshot_lock.acquire(prefix, "mine.yaml", "solver.yaml: snapshot_prefix")
    finally:
        other.communicate("\n", timeout=30)
    with pytest.raises(RuntimeError):  # the one that got it lets it go however its run ends
        with snapshot_lock.acquire(prefix, "mine.yaml", "solver.yaml: snapshot_prefix"):
            raise RuntimeError("boom")
    assert not os.path.exists(snapshot_lock.lock_path(prefix))
