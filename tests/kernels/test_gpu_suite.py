"""benchmarks/gpu_suite.py's orchestration, on the CPU: phases in child processes, time boxes, failures recorded.

The device run itself cannot happen here; ``--cpu-smoke`` runs the same phases small on numpy, and ``--emulated``
runs every phase's device code small on the emulated GPU.
"""
import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.test_cli import ROOT

SPEC = importlib.util.spec_from_file_location("gpu_suite", os.path.join(ROOT, "benchmarks", "gpu_suite.py"))
gpu_suite = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_suite)

KEYS = {"device", "cupy", "torch", "tests_passed", "tests_failed", "lenet_accuracy", "lenet_seconds", "nets",
        "data_pipeline"}
DATA_KEYS = {"images", "image_size", "net", "batch", "crop", "feed_matches", "lmdb_img_s", "synthetic_img_s",
             "wait_ms_per_iteration", "wait_share", "decode_workers", "decode_capacity_img_s", "pipeline_img_s",
             "input_bound", "runs"}
NET_KEYS = {"net", "batch", "precision", "layerforge_img_s", "torch_img_s", "layerforge_peak_mib", "torch_peak_mib"}


def test_a_real_phase_runs_in_a_child_process():
    result, error = gpu_suite.run_phase("net", ["layerforge", "lenet", 4, "fp32"], 60, mode="cpu-smoke")
    assert error is None and result["img_s"] > 0


def test_the_data_phases_run_small_in_child_processes(tmp_path):
    """--cpu-smoke's data phase: the JPEG set, the device feed against the host finish (both numpy here), and the
    zoo net (CIFAR-10 quick) fed by the LMDB and by its synthetic default."""
    made, error = gpu_suite.run_phase("data_set", [str(tmp_path)], 60, mode="cpu-smoke")
    assert error is None and os.path.exists(os.path.join(made["db"], "data.mdb")) and made["images"] == 32
    check, error = gpu_suite.run_phase("data_check", [made["db"]], 60, mode="cpu-smoke")
    assert error is None and check["feed_matches"] and check["feed_max_rel_diff"] == {"mean_value": 0, "mean_file": 0}
    lmdb, error = gpu_suite.run_phase("data_train", ["lmdb", made["db"], 60], 60, mode="cpu-smoke")
    assert error is None and lmdb["img_s"] > 0 and lmdb["pipeline_img_s"] > 0 and lmdb["input"]["batches"] == 2
    assert lmdb["input_bound"] in (True, False) and lmdb["wait_ms"] >= 0
    synthetic, error = gpu_suite.run_phase("data_train", ["synthetic", made["db"], 60], 60, mode="cpu-smoke")
    assert error is None and synthetic["img_s"] > 0 and "input" not in synthetic


def test_a_phase_past_its_box_is_stopped():
    result, error = gpu_suite.run_phase("tests", [], 0.5, mode="cpu-smoke")
    assert result is None and error.startswith("timed out after")


def test_suite_writes_every_key_and_goes_on_past_failures(tmp_path, monkeypatch):
    calls = []

    def fake(name, args, timeout, mode):
        calls.append((name, args, timeout))
        if name == "lenet":
            return None, "exit 1: RuntimeError: boom"
        canned = {"install": {}, "info": {"device": "Fake GPU 80GB", "cupy": "14.2.0", "torch": "2.11"},
                  "tests": {"tests_passed": 7, "tests_failed": 1, "failed_tests": ["t::x"]},
                  "net": {"img_s": 100.0 if args[:1] == ["layerforge"] else 125.0, "peak_mib": 10.0},
                  "convs": {"convs": [{"shape": [1, 2, 3, 3, 1, 1, 1]}]},
                  "data_set": {"db": "/scratch/lmdb", "images": 1024, "image_size": [500, 375], "jpeg_kib": 70.0},
                  "data_check": {"feed_matches": True},
                  "data_train": {"img_s": 900.0, "wait_ms": 2.5, "input": {"wait_share": 0.02, "workers": 16},
                                 "input_bound": False, "decode_capacity_img_s": 9000.0, "pipeline_img_s": 8000.0}
                  if args[:1] == ["lmdb"] else {"img_s": 950.0}}
        return canned[name], None

    monkeypatch.setattr(gpu_suite, "run_phase", fake)
    lines = []
    results, path = gpu_suite.suite(str(tmp_path), budget=100, mode="device", log=lines.append)
    assert os.path.basename(path).startswith("gpu-fake-gpu-80gb-") and path.endswith(".json")
    written = json.load(open(path))
    assert KEYS <= set(written) and written == json.loads(json.dumps(results))
    assert written["device"] == "Fake GPU 80GB" and written["tests_failed"] == 1
    assert written["lenet_accuracy"] is None and "boom" in written["phases"]["lenet"]["error"]
    assert [(r["net"], r["batch"], r["precision"]) for r in written["nets"]] == \
        [(n, b, p) for n, b in gpu_suite.NET_RUNS for p in gpu_suite.PRECISIONS] + \
        [(n, b, "fp32-graph") for n, b in gpu_suite.NET_RUNS]  # layerforge with CUDA graphs: no torch figure
    assert all(set(r) == NET_KEYS and r["torch_img_s"] == 125.0 for r in written["nets"][:-3])
    assert all(r["layerforge_img_s"] and "torch_img_s" not in r for r in written["nets"][-3:])
    assert written["convs"] and written["phases"]["convs"]["error"] is None
    data = written["data_pipeline"]
    assert DATA_KEYS <= set(data) and data["net"] == "resnet50" and data["batch"] == 64 and data["crop"] == 224
    assert (data["lmdb_img_s"], data["synthetic_img_s"], data["decode_workers"]) == (900.0, 950.0, 16)
    assert data["input_bound"] is False and data["feed_matches"] is True
    assert [a[0] for n, a, _ in calls if n == "data_train"] == ["lmdb", "synthetic"]
    assert [a for n, a, _ in calls if n == "data_check"] == [["/scratch/lmdb"]]
    # each run is told its box (its child times itself against it)
    assert [(a[1], a[2]) for n, a, _ in calls if n == "data_train"] == [("/scratch/lmdb", t) for n, _, t in calls
                                                                         if n == "data_train"]
    assert "data pipeline resnet50 900 img/s from the LMDB against 950 img/s synthetic, waited 2.5 ms" in lines[-1]
    # no phase is given more than what is left of the budget, less the reserve for writing the results
    assert max(t for _, _, t in calls) <= 100 - gpu_suite.RESERVE


def test_no_time_left_is_recorded_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_suite, "run_phase", lambda *a: pytest.fail("ran a phase with no time left"))
    results, _ = gpu_suite.suite(str(tmp_path), budget=5, mode="device", log=lambda line: None)
    assert {p["error"] for p in results["phases"].values()} == {"no time left"}


def test_the_emulated_suite_runs_every_phase_through_its_device_code(tmp_path):
    """``--emulated``: the whole suite at the smallest settings, each phase's device code (cupy, cuBLAS precisions, CUDA
    events, NVTX and device trace spans, a CUDA graph, the device data feed, the engines) on the emulated GPU. Its
    figures mean nothing; every phase must run without an error."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_suite.py"), "--emulated", "--out",
                           str(tmp_path), "--scratch", str(tmp_path / "scratch")], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [path] = glob.glob(str(tmp_path / "gpu-*.json"))
    results = json.load(open(path))
    assert {name: p["error"] for name, p in results["phases"].items()} == {name: None for name in results["phases"]}
    assert results["mode"] == "emulated" and results["device"].startswith("Emulated CUDA device")
    assert results["cupy"].endswith("+layerforge.emulator") and results["torch"] is None  # no PyTorch CUDA here
    assert results["tests_failed"] == 0 and results["tests_passed"] > 0
    assert results["lenet_iterations"] == 6 and results["lenet_accuracy"] is not None
    assert results["trace_nvtx"] and results["trace_device_spans"] > 0  # CUDA events around the traced layers
    assert [(r["precision"], r["layerforge_img_s"] > 0) for r in results["nets"]] == [
        ("fp32", True), ("tf32", True), ("fp32-graph", True)]
    data = results["data_pipeline"]
    assert data["feed_matches"] and data["lmdb_img_s"] > 0 and data["synthetic_img_s"] > 0
    assert data["pipeline_img_s"] > 0 and data["input_bound"] in (True, False)
    [conv] = results["convs"]
    assert conv["IM2COL_gflop_s"] > 0 and conv["IMPLICIT_gflop_s"] > 0 and conv["AUTO_engine"] in ("IM2COL", "IMPLICIT")
