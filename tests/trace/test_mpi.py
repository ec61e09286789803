"""Every rank's spans in one file under ``mpiexec -n 2``, on rank 0's clock, gathered or merged afterwards."""
import os

import pytest

from layerforge.trace import merge_files, summarize
from layerforge.trace.events import load_trace
from tests.comm.mpirun import run_mpi

pytestmark = pytest.mark.mpi

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_worker.py")
SKEW_US = 5e6  # rank 1's clock reads 5 s ahead (mpi_worker.py)
# the spans after a barrier start within this of each other on one host, even with both cores busy elsewhere
BARRIER_EXIT_US = 20e3


def check_aligned(doc):
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    clock = doc["otherData"]["processes"]["1"]
    assert clock["clock_applied"] is True and 0 < clock["clock_error_us"] < 10e3
    assert len(clock["clock_points_us"]) == 2  # measured at start and at the end
    for _, offset in clock["clock_points_us"]:
        assert abs(offset - SKEW_US) < clock["clock_error_us"] + 1.0
    after = {(e["pid"], e["args"]["iter"]): e["ts"] for e in spans if e["name"] == "after barrier"}
    assert sorted(after) == [(0, 1), (0, 2), (1, 1), (1, 2)]  # the window 1:3
    for k in (1, 2):
        assert abs(after[(0, k)] - after[(1, k)]) < BARRIER_EXIT_US
    # on each rank the allreduce runs on the comm thread while the compute thread's backward is still running
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    for pid in (0, 1):
        for k in (1, 2):
            (backward,) = [e for e in spans if (e["pid"], e["args"]["iter"], e["cat"]) == (pid, k, "backward")]
            (bucket,) = [e for e in spans if (e["pid"], e["args"]["iter"], e["name"]) == (pid, k, "bucket 0")]
            assert rows[(pid, bucket["tid"])] == "comm" and rows[(pid, backward["tid"])] == "compute"
            assert backward["ts"] <= bucket["ts"] < backward["ts"] + backward["dur"]
    result = summarize(doc)
    assert [r["name"] for r in result["ranks"]] == ["rank 0", "rank 1"] and result["iterations"] == [1, 2]
    for r in result["ranks"]:
        assert r["comm_ms"] > 0 and 0 <= r["exposed_ms"] <= r["comm_ms"] + 1e-9


def test_gathered_on_rank_0(tmp_path):
    path = tmp_path / "run.json"
    proc = run_mpi(2, [WORKER, str(path), "gather"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"rank 0 wrote {path}" in proc.stdout and "rank 1 wrote None" in proc.stdout
    check_aligned(load_trace(str(path)))


def test_per_rank_files_merged(tmp_path):
    path = tmp_path / "run.json"
    proc = run_mpi(2, [WORKER, str(path), "per-rank"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    parts = [tmp_path / "run.rank0.json", tmp_path / "run.rank1.json"]
    unmerged = load_trace(str(parts[1]))
    assert unmerged["otherData"]["processes"]["1"]["clock_applied"] is False
    merge_files(str(tmp_path / "all.json"), [str(p) for p in parts])
    check_aligned(load_trace(str(tmp_path / "all.json")))
