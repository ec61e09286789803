"""A ``layerforge train`` job under mpiexec that a test can watch, signal and kill, and a CPU hog to run beside it.

Every process of a job carries ``LAYERFORGE_TEST_JOB=<id>`` in its environment: the test finds a rank's
supervisor, its training child and the child's decode worker by it (and PMI_RANK), and ends whatever is left of
the job by pid when the test is done, so a failing test never leaves a job running.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy
import pytest
import yaml

from tests.comm.mpirun import ROOT, mpiexec

MARKER = "LAYERFORGE_TEST_JOB"


def write_records(path, records=64, shape=(3, 8, 8)):
    """An LMDB of ``records`` float records of ``shape`` with labels 0..2."""
    from layerforge.data.lmdb_io import LMDBWriter, encode_record

    g = numpy.random.default_rng(0)
    with LMDBWriter(str(path)) as w:
        for i in range(records):
            w.put(encode_record(g.standard_normal(shape).astype(numpy.float32) + i % 3, i % 3))


def write_solver(tmp_path, max_iter=100000, snapshot=0, conv_output=8, shape=(3, 8, 8), engine="AUTO", shuffle=True,
                 **keys):
    """A small conv net on :func:`write_records` data of ``shape`` (one decode worker per rank, records reshuffled
    every epoch unless ``shuffle`` is false, a Convolution of ``conv_output`` channels whose ``engine`` AUTO times
    before the first iteration); returns the solver path. Snapshots go to ``tmp_path/snap/net``; ``keys`` are more
    solver keys."""
    db = tmp_path / "db"
    if not db.exists():
        write_records(db, shape=shape)
    net = {"name": "net", "layers": [
        {"name": "data", "type": "Data", "top": ["data", "label"],
         "data": {"source": str(db), "batch_size": 4, "decode_workers": 1, "shuffle": shuffle}},
        {"name": "conv", "type": "Convolution", "bottom": "data", "top": "conv",
         "convolution": {"num_output": conv_output, "kernel_size": 3, "weight_filler": {"type": "xavier"},
                         "engine": engine}},
        {"name": "ip", "type": "InnerProduct", "bottom": "conv", "top": "ip",
         "inner_product": {"num_output": 3, "weight_filler": {"type": "xavier"}}},
        {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["ip", "label"], "top": "loss"}]}
    (tmp_path / "net.yaml").write_text(yaml.safe_dump(net))
    solver = {"net": "net.yaml", "base_lr": 0.01, "momentum": 0.9, "max_iter": max_iter, "display": 1,
              "snapshot": snapshot, "snapshot_prefix": str(tmp_path / "snap" / "net"), "random_seed": 1,
              "allreduce": "recursive", **keys}
    path = tmp_path / "solver.yaml"
    path.write_text(yaml.safe_dump(solver))
    return path


def snapshots(tmp_path):
    """The iterations of the solver states written under ``tmp_path/snap``, ascending."""
    found = (tmp_path / "snap").glob("net_iter_*.solverstate.npz") if (tmp_path / "snap").exists() else []
    return sorted(int(re.search(r"_iter_(\d+)\.", p.name).group(1)) for p in found)


def train(solver, *more):
    """The argv of ``layerforge train --solver solver more...``."""
    return [sys.executable, "-m", "layerforge", "train", "--solver", str(solver), *map(str, more)]


def under_mpiexec(ranks, argv):
    return [mpiexec(), "-n", str(ranks), *argv]


class Job:
    """The command ``argv`` (e.g. :func:`under_mpiexec` of :func:`train`), its output (stdout and stderr) collected
    line by line in ``lines``."""

    def __init__(self, argv, env=None, cwd=ROOT):
        self.id = uuid.uuid4().hex
        full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        **{MARKER: self.id}, **(env or {}))
        full_env.pop("LAYERFORGE_GROUP_SIZE", None)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=full_env, cwd=cwd, start_new_session=True)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def log(self):
        return "".join(self.lines)

    def wait_for(self, pattern, timeout=120, after=0):
        """The first match of the regular expression ``pattern`` in the output from offset ``after`` on (a previous
        match's ``end()``), waiting for it; fails the test (with the output) when the job ends or ``timeout`` seconds
        pass first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.compile(pattern).search(self.log, after)
            if found:
                return found
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        pytest.fail(f"no {pattern!r} in the job's output (exit {self.proc.poll()}):\n{self.log[-3000:]}")

    def processes(self, rank):
        """``{"supervisor": pid, "child": pid, "worker": pid}`` of ``rank`` (those that run now; rank None: the one
        process of a job that ``layerforge train --max-restarts`` started, as "child", and its decode worker)."""
        mine = {}
        for pid, env, ppid in _processes():
            if env.get(MARKER) != self.id or pid == self.proc.pid:
                continue
            if env.get("PMI_RANK") == str(rank) or rank is None and "PMI_RANK" not in env:
                mine[pid] = ppid
        if rank is None:  # no supervisor: the restarting parent stands in its place
            mine[self.proc.pid] = None
        found = {}
        for pid, ppid in mine.items():
            if ppid not in mine:
                found["supervisor"] = pid
        for pid, ppid in mine.items():
            if ppid == found.get("supervisor"):
                found["child"] = pid
        for pid, ppid in mine.items():
            if "child" in found and ppid == found["child"]:
                found["worker"] = pid
        return found

    def process(self, rank, which, timeout=60):
        """The pid of ``which`` (``supervisor``, ``child`` or ``worker``) of ``rank``, waiting for it to start."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.processes(rank).get(which)
            if pid is not None:
                return pid
            time.sleep(0.02)
        pytest.fail(f"rank {rank} has no {which} after {timeout} s:\n{self.log[-3000:]}")

    def signal(self, signum):
        """Send ``signum`` to the command this job started (mpiexec, or the command itself)."""
        self.proc.send_signal(signum)

    def finish(self, timeout=90):
        """Wait for the job to end; returns its exit status (fails the test when it runs past ``timeout``)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job still ran {timeout} s later:\n{self.log[-3000:]}")
        self._reader.join(10)
        return code

    def end(self):
        """Kill whatever is left of the job (by pid: every process that carries this job's marker)."""
        for pid, env, _ in _processes():
            if env.get(MARKER) == self.id:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.end()
        return False


def _processes():
    """``(pid, environment, parent pid)`` of every process this user may read."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                raw = f.read()
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if MARKER.encode() not in raw:
            continue
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        yield int(entry), env, ppid


@pytest.fixture
def cpu_hog():
    """A process spinning on one core for the test's duration, to shake the timing as a loaded machine does."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield hog
    hog.kill()
    hog.wait()
