"""benchmarks/gpu_suite.py's orchestration, on the CPU: phases in child processes, time boxes, failures recorded.

The device run itself cannot happen here; ``--cpu-smoke`` runs the same phases small on numpy.
"""
import importlib.util
import json
import os

import pytest

from tests.test_cli import ROOT

SPEC = importlib.util.spec_from_file_location("gpu_suite", os.path.join(ROOT, "benchmarks", "gpu_suite.py"))
gpu_suite = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_suite)

KEYS = {"device", "cupy", "torch", "tests_passed", "tests_failed", "lenet_accuracy", "lenet_seconds", "nets"}
NET_KEYS = {"net", "batch", "precision", "layerforge_img_s", "torch_img_s", "layerforge_peak_mib", "torch_peak_mib"}


def test_a_real_phase_runs_in_a_child_process():
    result, error = gpu_suite.run_phase("net", ["layerforge", "lenet", 4, "fp32"], 60, smoke=True)
    assert error is None and result["img_s"] > 0


def test_a_phase_past_its_box_is_stopped():
    result, error = gpu_suite.run_phase("tests", [], 0.5, smoke=True)
    assert result is None and error.startswith("timed out after")


def test_suite_writes_every_key_and_goes_on_past_failures(tmp_path, monkeypatch):
    calls = []

    def fake(name, args, timeout, smoke):
        calls.append((name, args, timeout))
        if name == "lenet":
            return None, "exit 1: RuntimeError: boom"
        canned = {"install": {}, "info": {"device": "Fake GPU 80GB", "cupy": "14.2.0", "torch": "2.11"},
                  "tests": {"tests_passed": 7, "tests_failed": 1, "failed_tests": ["t::x"]},
                  "net": {"img_s": 100.0 if args[:1] == ["layerforge"] else 125.0, "peak_mib": 10.0},
                  "convs": {"convs": [{"shape": [1, 2, 3, 3, 1, 1, 1]}]}}
        return canned[name], None

    monkeypatch.setattr(gpu_suite, "run_phase", fake)
    results, path = gpu_suite.suite(str(tmp_path), budget=100, smoke=False, log=lambda line: None)
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
    # no phase is given more than what is left of the budget, less the reserve for writing the results
    assert max(t for _, _, t in calls) <= 100 - gpu_suite.RESERVE


def test_no_time_left_is_recorded_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_suite, "run_phase", lambda *a: pytest.fail("ran a phase with no time left"))
    results, _ = gpu_suite.suite(str(tmp_path), budget=5, smoke=False, log=lambda line: None)
    assert {p["error"] for p in results["phases"].values()} == {"no time left"}
