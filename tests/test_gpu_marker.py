"""``pytest -m gpu`` selects every test that touches the device (tests/conftest.py marks them; docs/gpu.md)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["tests/layers/test_softmax.py", "tests/emulator/test_random.py", "tests/test_train_cli.py",
         "tests/data/test_device_feed.py", "tests/kernels/test_gemm.py"]


def collected(*args):
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args,
                           *FILES], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {line for line in proc.stdout.splitlines() if "::" in line}


def test_the_gpu_marker_selects_the_device_tests_and_only_those():
    every, gpu, cpu = collected(), collected("-m", "gpu"), collected("-m", "not gpu")
    assert gpu | cpu == every and not gpu & cpu
    # the xp fixture's cupy cases and not its numpy ones: "-k gpu" finds neither
    cupy_cases = {t for t in every if t.startswith("tests/layers/test_softmax.py") and "[cupy" in t}
    assert cupy_cases and cupy_cases <= gpu
    assert not {t for t in gpu if t.startswith("tests/layers/") and "cupy" not in t}
    # every test of the emulator, the device feed's, and one that says --gpu in its body only (marked by hand)
    assert {t for t in every if t.startswith(("tests/emulator/", "tests/data/test_device_feed.py"))} <= gpu
    assert "tests/test_train_cli.py::test_weights_then_test_command" in gpu
    # a stand-in for cupy that is no device (kernels/test_gemm.py's fake_cupy), and a CPU run, are not
    assert not {t for t in gpu if t.startswith("tests/kernels/test_gemm.py")}
    assert "tests/test_train_cli.py::test_resume_from_snapshot_continues_the_same_run" not in gpu
