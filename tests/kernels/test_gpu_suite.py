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
NET_KEYS = {"net", "batch", "precision", "layerforge_img_s", "torch_img_s", "layerforge_peak_mib", "torch_peak_mib",
            "layerforge_iterations", "torch_iterations", "layerforge_settled"}


def test_a_real_phase_runs_in_a_child_process():
    result, error = gpu_suite.run_phase("net", ["layerforge", "lenet", 4, "fp32", 60], 60, mode="cpu-smoke")
    assert error is None and result["img_s"] > 0 and result["iterations"] == 1 and result["settled"]


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
    result, error = gpu_suite.run_phase("tests", [0.5], 0.5, mode="cpu-smoke")
    assert result is None and error.startswith("timed out after")


def test_a_stopped_test_run_counts_what_it_finished():
    """The tests phase's reading of pytest's -v lines, with xdist's and without, where a run stopped before its
    report: each test's last outcome (a teardown ERROR after PASSED is a failure)."""
    output = "\n".join([
        "============================= test session starts ==============================",
        "[gw0] [  1%] PASSED tests/kernels/test_lrn.py::test_lrn_forward[cupy-float32]",
        "[gw1] [  2%] FAILED tests/layers/test_conv.py::test_conv[cupy-3x3]",
        "[gw0] [  3%] SKIPPED tests/test_backend.py::test_two_devices[cupy]",
        "[gw2] [  4%] PASSED tests/layers/test_pool.py::test_max[cupy]",
        "[gw2] [  4%] ERROR tests/layers/test_pool.py::test_max[cupy]",
        "tests/net/test_fusion.py::test_fused[cupy] PASSED                        [  5%]"])
    assert gpu_suite.outcomes_of_tests(output) == {
        "tests/kernels/test_lrn.py::test_lrn_forward[cupy-float32]": "PASSED",
        "tests/layers/test_conv.py::test_conv[cupy-3x3]": "FAILED",
        "tests/test_backend.py::test_two_devices[cupy]": "SKIPPED",
        "tests/layers/test_pool.py::test_max[cupy]": "ERROR",
        "tests/net/test_fusion.py::test_fused[cupy]": "PASSED"}


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
                  if args[:1] == ["lmdb"] else {"img_s": 950.0},
                  "kernels": {"kernels_file": "kernels-fake-gpu-80gb-20261201.npz", "kernels_outputs": 89},
                  "sanitize": {"sanitizer": "/usr/local/cuda/bin/compute-sanitizer",
                               "memcheck": {"errors": 0, "pytest": "7 passed in 9s", "timed_out": False},
                               "racecheck": {"errors": 0, "hazards": 2, "pytest": "7 passed in 12s",
                                             "timed_out": False}},
                  "ncu": {"ncu_report": "ncu-implicit-gemm-forward-20261201.ncu-rep",
                          "ncu_summary": {"GPU Speed Of Light Throughput: Duration (us)": "412.35"}}}
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
        [(n, b, p) for n, b in gpu_suite.NET_RUNS for p in gpu_suite.PRECISIONS] + [("resnet50", 64, "bf16")] + \
        [(n, b, "fp32-graph") for n, b in gpu_suite.NET_RUNS]  # layerforge with CUDA graphs: no torch figure
    assert all(set(r) == NET_KEYS and r["torch_img_s"] == 125.0 for r in written["nets"][:-3])
    assert written["kernels_outputs"] == 89 and written["ncu_report"].endswith(".ncu-rep")
    # the nets phase's time is shared by weight, ResNet-50's runs 2 (17 runs: 7 of ResNet-50), each told its share:
    # the first run 2/24 of it, AlexNet's first (after ResNet-50's four) 1/16
    nets = [(a, t) for n, a, t in calls if n == "net"]
    assert len(nets) == 17 and all(a[-1] == pytest.approx(t, abs=0.01) for a, t in nets)
    assert nets[0][0][1] == "resnet50" and nets[4][0][1] == "alexnet"
    assert nets[0][1] / nets[4][1] == pytest.approx((2 / 24) / (1 / 16), rel=1e-3)
    assert written["sanitizer"]["racecheck"]["hazards"] == 2
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
    assert ("89 kernel outputs saved, memcheck 0 errors (7 passed in 9s); racecheck 0 errors, 2 hazards (7 passed "
            "in 12s), ncu conv_forward 412.35 us") in lines[-1]
    # no phase is given more than what is left of the budget, less the reserve for writing the results
    assert max(t for _, _, t in calls) <= 100 - gpu_suite.RESERVE


def test_phases_named_run_alone(tmp_path, monkeypatch, capsys):
    """``--phases install,info,kernels``: a first short device call that checks the install, the device and every
    kernel's compilation; the other phases are recorded as skipped, none run. A name that is no phase: one line."""
    calls = []
    monkeypatch.setattr(gpu_suite, "run_phase", lambda name, args, timeout, mode: (calls.append(name) or (
        {"device": "Fake GPU"} if name == "info" else {"kernels_outputs": 89} if name == "kernels" else {}, None)))
    results, _ = gpu_suite.suite(str(tmp_path), budget=100, mode="device", log=lambda line: None,
                                 phases=["install", "info", "kernels"])
    assert calls == ["install", "info", "kernels"] and results["nets"] == [] and results["kernels_outputs"] == 89
    skipped = {k for k, p in results["phases"].items() if p.get("skipped")}
    assert {"tests", "lenet", "sanitize", "ncu", "data/set", "data/lmdb", "convs"} <= skipped
    assert not skipped & {"install", "info", "kernels"}
    with pytest.raises(SystemExit) as stop:
        gpu_suite.main(["--cpu-smoke", "--phases", "install,bogus"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gpu_suite.py: error: argument --phases: 'install,bogus': name phases of " + ", ".join(gpu_suite.BOXES))


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
    assert results["lenet_cpu_iterations"] == 6 and results["lenet_cpu_accuracy"] is not None
    assert results["trace_nvtx"] and results["trace_device_spans"] > 0  # CUDA events around the traced layers
    assert [(r["precision"], r["layerforge_img_s"] > 0) for r in results["nets"]] == [
        ("fp32", True), ("tf32", True), ("bf16", True), ("fp32-graph", True)]
    assert results["kernels_outputs"] == 89 and os.path.exists(tmp_path / results["kernels_file"])
    assert results["sanitizer"] == {"sanitizer": None} and results["ncu"] is None  # no such tools here
    data = results["data_pipeline"]
    assert data["feed_matches"] and data["lmdb_img_s"] > 0 and data["synthetic_img_s"] > 0
    assert data["pipeline_img_s"] > 0 and data["input_bound"] in (True, False)
    [conv] = results["convs"]
    assert conv["IM2COL_gflop_s"] > 0 and conv["IMPLICIT_gflop_s"] > 0 and conv["AUTO_engine"] in ("IM2COL", "IMPLICIT")


GPU_KERNELS_SPEC = importlib.util.spec_from_file_location("gpu_kernels",
                                                          os.path.join(ROOT, "benchmarks", "gpu_kernels.py"))
gpu_kernels = importlib.util.module_from_spec(GPU_KERNELS_SPEC)
GPU_KERNELS_SPEC.loader.exec_module(gpu_kernels)


def test_the_emulated_kernels_agree_with_the_host_bodies_and_a_changed_output_is_listed(tmp_path):
    """gpu_kernels.py: every .cu entry point and each GEMM precision on the emulated device against the numpy bodies
    on the same inputs, within the tolerances that the comparison with silicon uses; then a saved file with one output
    changed by 1e-4 of its norm, one removed and an argmax moved: ``--against`` lists those three and exits 1."""
    import numpy
    import cupy

    host, device = gpu_kernels.all_outputs(numpy), gpu_kernels.all_outputs(cupy)
    assert sorted(host) == sorted(device) and len(host) == 89
    assert {"float32/implicit_gemm/k3s2g1/1", "float64/lrn/backward", "bf16/gemm", "tf32/gemm"} <= set(host)
    rows = gpu_kernels.compare(device, host)
    assert [r[0] for r in rows if r[4]] == []
    assert dict((r[0], r[3]) for r in rows)["float32/max_pooling/forward/1"] == 1.0  # the argmax: equal
    # the CUDA kernels sum in another order than the host's: not every bit is equal, and the table shows it
    relative = dict((r[0], r[1]) for r in rows)
    assert 0 < relative["float32/implicit_gemm/k3s1g1/1"] < gpu_kernels.TOLERANCE["float32"]
    assert 0 < relative["tf32/gemm"] < gpu_kernels.TOLERANCE["tf32"]  # the emulated cuBLAS rounds to TF32; numpy not

    saved = dict(device)
    y = saved["float32/implicit_gemm/k3s1g1/0"]
    y[0, 0, 0, 0] += 1e-4 * numpy.linalg.norm(y)
    del saved["float64/lrn/backward"]
    saved["float64/max_pooling/forward/1"] = saved["float64/max_pooling/forward/1"] + 1
    path = tmp_path / "silicon.npz"
    numpy.savez_compressed(path, device=numpy.array("Fake GPU"), **saved)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_kernels.py"), "--against", str(path)],
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, LAYERFORGE_EMULATED_GPU="1"),
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "against Fake GPU" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == ("89 outputs, 3 differ: float32/implicit_gemm/k3s1g1/0, "
                                                    "float64/lrn/backward, float64/max_pooling/forward/1")
    assert "| float32/implicit_gemm/k3s1g1/0 | 1.00e-04 |" in proc.stdout


FAKE_SANITIZER = """#!/bin/sh
# compute-sanitizer's options (each with its value) end at the program, which runs as it would under the tool
tool=memcheck
while [ "${1#--}" != "$1" ]; do [ "$1" = --tool ] && tool=$2; shift 2; done
"$@"
status=$?
echo "========= ERROR SUMMARY: 0 errors"
[ "$tool" = racecheck ] && echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
exit $status
"""

FAKE_NCU = """#!/bin/sh
if [ "$1" = --import ]; then
  echo '==PROF== Disconnected'
  echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",\
"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name"'
  echo '"0","9","python3","127.0.0.1","conv_forward","1","7","(16, 16, 1)","(3136, 8, 1)","0","9.0",\
"GPU Speed Of Light Throughput","Duration","us","412.35",""'
  echo '"0","9","python3","127.0.0.1","conv_forward","1","7","(16, 16, 1)","(3136, 8, 1)","0","9.0",\
"GPU Speed Of Light Throughput","Compute (SM) Throughput","%","61.2",""'
  echo '"0","9","python3","127.0.0.1","conv_forward","1","7","(16, 16, 1)","(3136, 8, 1)","0","9.0",\
"Occupancy","Achieved Occupancy","%","88.1",""'
  echo '"0","9","python3","127.0.0.1","conv_forward","1","7","(16, 16, 1)","(3136, 8, 1)","0","9.0",\
"Launch Statistics","Registers Per Thread","register/thread","40",""'
  echo '"0","9","python3","127.0.0.1","conv_forward","1","7","(16, 16, 1)","(3136, 8, 1)","0","9.0",\
"Occupancy","","","","AchievedOccupancy"'
  exit 0
fi
while [ "${1#--}" != "$1" ]; do
  case "$1" in --force-overwrite) shift;; --export) out=$2; shift 2;; *) shift 2;; esac
done
"$@" || exit $?
echo report > "$out.ncu-rep"
"""


def fake_tools(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("compute-sanitizer", FAKE_SANITIZER), ("ncu", FAKE_NCU)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_the_sanitizer_phase_runs_the_kernels_tests_under_each_tool(tmp_path, monkeypatch):
    """The sanitize phase's command lines, through a stand-in compute-sanitizer that runs the program it is given:
    pytest of the CUDA kernels' GPU tests (cupy's pool off) under memcheck and racecheck, each report read."""
    fake_tools(tmp_path, monkeypatch)
    result, error = gpu_suite.run_phase("sanitize", [120], 120, mode="emulated")
    assert error is None and result["sanitizer"] == str(tmp_path / "bin" / "compute-sanitizer")
    for tool in gpu_suite.SANITIZER_TOOLS:
        run = result[tool]
        assert (run["exit"], run["errors"], run["timed_out"], run["reported_error"]) == (0, 0, False, False)
        assert run["pytest"].startswith("7 passed, 1 deselected"), run  # test_lrn's 6 cases; the other on cupy
    assert result["racecheck"]["hazards"] == 0 and result["memcheck"]["hazards"] is None


def test_a_sanitizer_report_is_read():
    output = "\n".join([
        "========= COMPUTE-SANITIZER",
        "........",
        "========= Invalid __global__ read of size 4 bytes",
        "=========     at conv_forward+0x1a0",
        "=========     by thread (3,0,0) in block (12,0,0)",
        "1 failed, 20 passed, 4 deselected in 31.20s",
        "========= ERROR SUMMARY: 3 errors"])
    report = gpu_suite.sanitizer_report(output, gpu_suite.SANITIZER_ERRORS)
    assert (report["errors"], report["hazards"], report["reported_error"]) == (3, None, True)
    assert report["pytest"] == "1 failed, 20 passed, 4 deselected in 31.20s"
    assert report["report"][1] == "========= Invalid __global__ read of size 4 bytes" and len(report["report"]) == 5
    timed_out = gpu_suite.sanitizer_report("========= COMPUTE-SANITIZER\n..", None)
    assert timed_out["timed_out"] and timed_out["errors"] is None and not timed_out["reported_error"]


def test_the_ncu_phase_profiles_the_implicit_gemm_forward_and_reads_its_report(tmp_path, monkeypatch):
    """The ncu phase's command lines, through a stand-in ncu that runs the program it is given (gpu_kernels.py
    --profile, one image, on the emulated device) and answers the report's import with ncu's CSV."""
    fake_tools(tmp_path, monkeypatch)
    result, error = gpu_suite.run_phase("ncu", [str(tmp_path / "out"), 120], 120, mode="emulated")
    assert error is None, error
    assert os.path.exists(tmp_path / "out" / result["ncu_report"])
    assert result["ncu_launch"] == {"Kernel Name": "conv_forward", "Block Size": "(16, 16, 1)",
                                    "Grid Size": "(3136, 8, 1)", "Device": "0"}
    assert result["ncu_summary"] == {"GPU Speed Of Light Throughput: Duration (us)": "412.35",
                                     "GPU Speed Of Light Throughput: Compute (SM) Throughput (%)": "61.2",
                                     "Occupancy: Achieved Occupancy (%)": "88.1",
                                     "Launch Statistics: Registers Per Thread (register/thread)": "40"}
    assert len(result["ncu_metrics"]) == 4  # the rule's row is advice, not a metric


def test_the_convs_phase_stops_timing_shapes_at_its_box(monkeypatch):
    """A box already spent: no shape is timed, and the results say how many were left (a run killed at its box
    would give none of the shapes it had timed)."""
    monkeypatch.setattr(gpu_suite, "STARTED", gpu_suite.time.perf_counter() - 100)
    assert gpu_suite.phase_convs(gpu_suite.Mode("cpu-smoke"), 10) == {"convs": [], "convs_left": 1}
    monkeypatch.setattr(gpu_suite, "STARTED", gpu_suite.time.perf_counter())
    timed = gpu_suite.phase_convs(gpu_suite.Mode("cpu-smoke"), 600)
    assert timed["convs_left"] == 0 and timed["convs"][0]["IM2COL_gflop_s"] > 0
