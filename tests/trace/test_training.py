"""The trace of real training runs: `layerforge train --trace` alone and under mpiexec with overlap."""
import json
import subprocess
import sys

import pytest

from layerforge.trace import load_trace, summarize
from layerforge.trace.summary import compute_threads, spans
from tests.comm.mpirun import ROOT, mpiexec

SOLVER = """net: {net}
base_lr: 0.01
momentum: 0.9
max_iter: 6
display: 0
snapshot_after_train: false
allreduce_bucket_mb: {bucket_mb}
allreduce_overlap: {overlap}
trace_iterations: "2:5"
"""


def _train(tmp_path, ranks, overlap=True, bucket_mb=0.05):
    solver = tmp_path / "solver.yaml"
    solver.write_text(SOLVER.format(net=f"{ROOT}/configs/lenet.yaml", bucket_mb=bucket_mb,
                                    overlap=str(overlap).lower()))
    out = tmp_path / "run.json"
    command = [sys.executable, "-m", "layerforge", "train", "--solver", str(solver), "--no-progress", "--trace",
               str(out)]
    if ranks > 1:
        command = [mpiexec(), "-n", str(ranks)] + command
    proc = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return load_trace(str(out))


def test_one_process_trace_names_every_layer_and_step(tmp_path):
    doc = _train(tmp_path, 1)
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["args"]["iter"] for e in events} == {2, 3, 4}
    for e in events:
        assert {"ph", "ts", "dur", "pid", "tid", "cat", "name"} <= set(e) and e["dur"] >= 0
    forward = {e["name"] for e in events if e["cat"] == "forward"}
    assert {"mnist", "conv1", "pool1", "conv2", "ip1", "ip2", "loss"} <= forward
    conv1 = next(e for e in events if e["cat"] == "forward" and e["name"] == "conv1" and "trial" not in e["args"])
    assert conv1["args"]["type"] == "Convolution"
    assert [e["name"] for e in events if e["cat"] == "update"] == ["SGD"] * 3
    assert doc["traceEvents"][0]["ph"] == "M"


@pytest.mark.mpi
def test_overlapped_two_ranks_send_buckets_while_backward_runs(tmp_path):
    # buckets of 10 KB: the first holds ip2's gradient alone and leaves before ip1's backward, the longest, so a loaded
    # machine's late start of the communication thread still falls inside a backward span (at 50 KB it waited for part
    # of ip1's, and rank 1 started it after the last backward span once in CI)
    doc = _train(tmp_path, 2, bucket_mb=0.01)
    events = spans(doc)
    compute = compute_threads(doc, events)
    for pid in (0, 1):
        backward = [e for e in events if e["pid"] == pid and e["cat"] == "backward"]
        buckets = [e for e in events if e["pid"] == pid and e["cat"] == "comm" and e["name"].startswith("bucket")]
        assert buckets and all(e["tid"] != compute[pid] for e in buckets)  # on the communication thread
        during = [b for b in buckets if any(s["ts"] < b["ts"] < s["ts"] + s["dur"] for s in backward)]
        assert during, f"rank {pid}: no bucket started while a backward span ran"
        assert {tuple(b["args"]["layers"]) for b in buckets} and all(b["args"]["bytes"] > 0 for b in buckets)
    summary = summarize(doc)
    for rank in summary["ranks"]:
        waits = [e for e in events if e["pid"] == rank["pid"] and e["cat"] == "comm" and e["tid"] == compute[rank["pid"]]]
        assert rank["exposed_ms"] == pytest.approx(sum(e["dur"] for e in waits) / 1e3 / rank["iterations"], rel=1e-6)


@pytest.mark.mpi
def test_exchange_after_backward_is_all_exposed(tmp_path):
    doc = _train(tmp_path, 2, overlap=False, bucket_mb=0)
    summary = summarize(doc)
    for rank in summary["ranks"]:
        assert rank["comm_ms"] > 0 and rank["overlap"] == pytest.approx(0.0, abs=1e-9)
    json.dumps(summary)
