"""The trace of CGDP runs: `layerforge train --workers 2 --sync host` and `--cpu-parallel REPLICAS` (its split batch),
one file with a process per worker and one for the host (docs/trace.md, docs/cgdp.md)."""
import collections
import json
import os
import queue
import subprocess
import sys
import threading

import numpy
import pytest

from layerforge.trace import load_trace, summarize
from layerforge.trace.summary import compute_threads, names, spans
from tests.dataparallel.cgdp.helpers import SMALL_NET as NET
from tests.comm.mpirun import mpiexec
from tests.test_cli import ROOT

LAYERS = ["data", "conv1", "relu1", "ip1", "ip2", "loss"]
CHUNKS = ["ip2", "ip1", "conv1"]  # chunk_size 1: one chunk per layer with parameters, in backward order
WINDOW = [2, 3, 4]
HOST = 1000


def two_cores():
    """Run the child on 2 of this machine's cores: REPLICAS makes one replica per core."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])


def layerforge(*args, cwd, launcher=()):
    proc = subprocess.run([*map(str, launcher), sys.executable, "-m", "layerforge", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          preexec_fn=two_cores)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def train(d, *options, launcher=()):
    (d / "net.yaml").write_text(NET)
    (d / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.01\nmax_iter: 6\ndisplay: 1\n"
                                   "snapshot_after_train: false\n")
    proc = layerforge("train", "--solver", "solver.yaml", "--no-progress", "--trace", d / "run.json",
                      "--trace-iterations", "2:5", *options, cwd=d, launcher=launcher)
    return load_trace(str(d / "run.json")), proc


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    d = tmp_path_factory.mktemp("cgdp")
    doc, _ = train(d, "--workers", 2, "--sync", "host", "--chunk-size", 1)
    return d, doc


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("REPLICAS needs 2 cores")
    d = tmp_path_factory.mktemp("replicas")
    doc, proc = train(d, "--cpu-parallel", "REPLICAS", "--tensorboard", d / "tb")
    return d, doc, proc


def by_process(doc):
    """``{pid: {cat: [spans]}}`` and the thread names."""
    out = collections.defaultdict(lambda: collections.defaultdict(list))
    for e in spans(doc):
        out[e["pid"]][e["cat"]].append(e)
    return out, names(doc)[1]


def check_workers_and_host(doc, host_combines=True):
    """What both kinds of run record: 2 workers with every layer's spans per iteration, the host's accumulations
    between the workers' backward of a chunk's layer and their wait for the last chunk. ``host_combines``
    False: replicas of a split batch, which make the mean in their update (cgdp/host.py's combines_in_update),
    so the host only publishes the chunks and frames the iterations."""
    processes, threads = names(doc)
    assert processes == {0: "worker 0", 1: "worker 1", HOST: "host"}
    events, threads = by_process(doc)
    compute = compute_threads(doc)
    assert {threads[(pid, compute[pid])] for pid in (0, 1)} == {"compute"} and HOST not in compute
    for pid in (0, 1):
        mine = events[pid]
        for k in WINDOW:
            forward = [e["name"] for e in mine["forward"] if e["args"]["iter"] == k and "trial" not in e["args"]]
            assert forward == LAYERS, (pid, k)  # each layer once, in forward order
            backward = [e["name"] for e in mine["backward"] if e["args"]["iter"] == k and "trial" not in e["args"]]
            assert backward[:3] == ["loss", "ip2", "ip1"] and set(backward) <= set(LAYERS), (pid, k)
            assert [e["name"] for e in mine["update"] if e["args"]["iter"] == k] == ["SGD"]
            assert [e["name"] for e in mine["iteration"] if e["args"]["iter"] == k] == ["iteration"]
        waits = [e for e in mine["comm"] if e["args"]["what"] == "chunks" and e["tid"] == compute[pid]]
        assert [e["args"]["iter"] for e in waits] == WINDOW and {e["name"] for e in waits} == {"wait"}
    host = events[HOST]
    if not host_combines:
        assert sorted(host) == ["iteration"]  # no accumulation on the host, no host time in the summary
        assert {e["args"]["iter"] for e in host["iteration"]} == set(WINDOW)
        rows = {r["name"]: r for r in summarize(doc)["ranks"]}
        assert rows["host"]["host_ms"] == 0 and rows["worker 0"]["host_ms"] == 0
        return
    assert sorted(host) == ["host", "iteration"]  # the host only combines
    for k in WINDOW:
        accumulations = sorted((e for e in host["host"] if e["args"]["iter"] == k), key=lambda e: e["ts"])
        assert [e["name"] for e in accumulations] == [f"accumulate {c}" for c in CHUNKS], k
        frame = [e for e in host["iteration"] if e["args"]["iter"] == k]
        assert len(frame) == 1
        for e in accumulations:
            assert threads[(HOST, e["tid"])].startswith("host accumulate")
            assert e["args"]["bytes"] > 0 and e["args"]["workers"] == 2
            # inside the host's iteration k: it ends with the last chunk's publication
            assert frame[0]["ts"] <= e["ts"] and e["ts"] + e["dur"] <= frame[0]["ts"] + frame[0]["dur"] + 1.0
            layer = e["name"].split()[1]
            for pid in (0, 1):  # after every worker's backward of the chunk's layer, before its wait ends
                done = next(b for b in events[pid]["backward"] if b["name"] == layer and b["args"]["iter"] == k)
                assert e["ts"] >= done["ts"] + done["dur"], (k, layer, pid)
                wait = next(w for w in events[pid]["comm"] if w["args"] == {"iter": k, "what": "chunks"})
                assert e["ts"] + e["dur"] <= wait["ts"] + wait["dur"], (k, layer, pid)
    assert {e["args"]["iter"] for e in host["iteration"]} == set(WINDOW)  # no frame for an iteration never run
    summary = summarize(doc)
    assert summary["iterations"] == WINDOW
    rows = {r["name"]: r for r in summary["ranks"]}
    assert rows["host"]["host_ms"] > 0 and rows["host"]["forward_ms"] == 0
    assert rows["worker 0"]["exposed_ms"] > 0 and rows["worker 0"]["host_ms"] == 0
    assert all(it["slowest"] in (0, 1) and set(it["busy_ms"]) == {0, 1} for it in summary["per_iteration"])


def test_workers_record_one_file_with_the_host(workers):
    d, doc = workers
    check_workers_and_host(doc)
    # each worker trained on its own batch of 4
    data = [e for e in spans(doc) if e["cat"] == "forward" and e["name"] == "data"]
    assert {json.dumps(e["args"]["top"]) for e in data} == {json.dumps([[4, 3, 12, 12], [4]])}


def test_time_with_workers_records_the_same_trace(tmp_path):
    (tmp_path / "net.yaml").write_text(NET)
    layerforge("time", "--model", "net.yaml", "--workers", 2, "--iterations", 5, "--trace", tmp_path / "time.json",
               "--trace-iterations", "2:5", cwd=tmp_path)
    check_workers_and_host(load_trace(str(tmp_path / "time.json")))


def test_summary_and_plot_of_a_workers_trace(workers):
    d, _ = workers
    text = layerforge("trace", "summary", "run.json", cwd=d).stdout
    assert "3 process(es), iterations 2-4" in text
    header = next(line for line in text.splitlines() if line.startswith("process"))
    assert header.split()[-1] == "host"
    host = next(line for line in text.splitlines() if line.startswith("host "))
    assert float(host.split()[-1]) > 0
    out = layerforge("trace", "plot", "run.json", "-o", d / "run.png", cwd=d).stdout
    assert "iteration 2" in out and (d / "run.png").stat().st_size > 0


def test_replicas_record_as_workers_of_half_the_batch(replicas):
    _, doc, proc = replicas
    assert "CPU parallelism: REPLICAS, 2 single-threaded replicas" in proc.stderr
    assert "training as THREADS" not in proc.stderr
    check_workers_and_host(doc, host_combines=False)
    data = [e for e in spans(doc) if e["cat"] == "forward" and e["name"] == "data"]
    assert {json.dumps(e["args"]["top"]) for e in data} == {json.dumps([[2, 3, 12, 12], [2]])}  # 4 split in 2
    # worker 0 waits for the other replica's forward (the mean loss) and for the last chunk: two waits
    waits = [e for e in spans(doc) if e["pid"] == 0 and e["cat"] == "comm" and e["args"]["iter"] == 3]
    assert [(e["name"], e["args"]["what"]) for e in sorted(waits, key=lambda e: e["ts"])] == [
        ("wait", "train outputs"), ("wait", "chunks")]


def test_replicas_write_tensorboard_scalars_from_worker_0(replicas):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    d, _, proc = replicas
    acc = event_accumulator.EventAccumulator(str(d / "tb"))
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert [step for step, _ in scalars["train/loss"]] == list(range(6))
    # the mean loss of the two replicas, as worker 0 displays it
    shown = [float(line.rsplit("loss = ", 1)[1]) for line in proc.stderr.splitlines()
             if "Iteration" in line and "loss = " in line]
    assert [value for _, value in scalars["train/loss"]] == pytest.approx(shown[:6], rel=1e-5)  # then "Iteration 6"
    assert [step for step, _ in scalars["train/images_per_second"]] == list(range(1, 6))
    assert all(value > 0 for _, value in scalars["train/images_per_second"])
    assert all(value >= 0 for _, value in scalars["train/comm_exposed_ms"])


@pytest.mark.mpi
def test_two_nodes_record_their_workers_hosts_and_network_chunks(tmp_path):
    doc, _ = train(tmp_path, "--workers", 2, "--sync", "host", "--chunk-size", 1, launcher=(mpiexec(), "-n", 2))
    processes, threads = names(doc)
    assert processes == {0: "node 0 worker 0", 1: "node 0 worker 1", 2: "node 1 worker 0", 3: "node 1 worker 1",
                         HOST: "node 0 host", HOST + 1: "node 1 host"}
    events, _ = by_process(doc)
    for host in (HOST, HOST + 1):
        for k in WINDOW:
            accumulations = {e["name"].split()[1]: e for e in events[host]["host"] if e["args"]["iter"] == k}
            chunks = [e for e in events[host]["comm"] if e["args"]["iter"] == k]
            # in chunk order on the network thread, each after its chunk's sum over the node's workers
            assert [e["name"] for e in chunks] == [f"chunk {c}" for c in CHUNKS], (host, k)
            assert {threads[(host, e["tid"])] for e in chunks} == {"comm"}
            for e in chunks:
                summed = accumulations[e["name"].split()[1]]
                assert e["ts"] >= summed["ts"] + summed["dur"] and e["args"]["bytes"] > 0
    assert {e["args"]["iter"] for pid in range(4) for e in events[pid]["backward"]} == set(WINDOW)


class Loopback:
    """The parent of one worker (G = 1: the mean is the chunk): each posted chunk comes back "ready" on a thread
    named as a worker's receiver."""

    def __init__(self):
        self.handlers, self.inbox = {}, queue.SimpleQueue()
        threading.Thread(target=self._receive, name="cgdp-inbox", daemon=True).start()

    def _receive(self):
        while True:
            c = self.inbox.get()
            self.handlers["ready"](("ready", c, None))

    def send(self, msg):
        assert msg[0] == "post"
        self.inbox.put(msg[1])

    def check(self):
        pass


def test_a_gpu_worker_records_copy_out_and_copy_back_between_backward_and_its_wait(tmp_path):
    """A worker on a device (the emulated one without a GPU): its CupyMover copies each chunk out on its copy stream
    into the pinned slot and back, on the host threads the trace names."""
    from layerforge import trace
    from layerforge.dataparallel.cgdp.chunks import param_units
    from layerforge.dataparallel.cgdp.host import HostSync, _param_offsets
    from layerforge.dataparallel.cgdp.stats import PhaseTimer
    from layerforge.dataparallel.cgdp.transfer import CupyMover, make_mover
    from layerforge.solvers import get_solver
    from tests.dataparallel.cgdp.helpers import flat_params, solver, write_lmdb

    db = write_lmdb(tmp_path / "db")
    s = get_solver(solver(db, 4, max_iter=3, solver_mode="GPU"))
    units = param_units(s.net)
    slot = numpy.zeros(sum(u.size for u in units), s.net.dtype)
    mover = make_mover(s.net, _param_offsets(s.net, units), (slot,))
    assert isinstance(mover, CupyMover) and not mover.attach_diffs(slot)
    s.add_seam(HostSync(s, Loopback(), slot, 1, mover, PhaseTimer()))
    trace.start(None, iterations=(1, 3))
    s.step(3)
    part = trace.stop()
    mover.close()
    reference = get_solver(solver(db, 4, max_iter=3))  # one CPU worker: the chunks came back as they went
    reference.step(3)
    numpy.testing.assert_allclose(flat_params(s), flat_params(reference), rtol=1e-10, atol=1e-12)
    rows = {key: row for key, (_, row) in part["threads"].items()}
    events = [dict(zip(("cat", "name", "ts", "dur", "row", "iter", "args"), e)) for e in part["events"]]
    for e in events:
        e["row"] = rows[e["row"]]
    chunks = [u.name for u in units]  # chunk_size 1, backward order: ip5 ... conv
    for k in (1, 2):
        mine = [e for e in events if e["iter"] == k]
        out = [e for e in mine if e["name"].startswith("copy-out")]
        back = [e for e in mine if e["name"].startswith("copy-back")]
        assert [e["name"] for e in out] == [f"copy-out {c}" for c in chunks]
        assert {e["row"] for e in out} == {"host copy-out"} and {e["cat"] for e in out + back} == {"host"}
        assert sorted(e["name"] for e in back) == sorted(f"copy-back {c}" for c in chunks)
        assert {e["row"] for e in back} == {"host copy-back"}
        [wait] = [e for e in mine if e["cat"] == "comm"]
        assert wait["row"] == "compute" and wait["args"] == {"what": "chunks"}
        for c in chunks:
            [layer] = [e for e in mine if e["cat"] == "backward" and e["name"] == c and "trial" not in e["args"]]
            [o] = [e for e in out if e["name"] == f"copy-out {c}"]
            [b] = [e for e in back if e["name"] == f"copy-back {c}"]
            assert o["args"]["bytes"] == b["args"]["bytes"] == next(u.size for u in units if u.name == c) * 8
            # the chunk leaves after its layer's backward, comes back after it left, before the wait ends
            assert layer["ts"] + layer["dur"] <= o["ts"] and o["ts"] + o["dur"] <= b["ts"]
            assert b["ts"] + b["dur"] <= wait["ts"] + wait["dur"]
