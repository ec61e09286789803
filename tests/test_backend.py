"""CPU use never imports cupy; a GPU request without cupy or a device fails with one line."""
import subprocess
import sys

import numpy

from layerforge import backend
from tests.test_cli import ROOT


def test_cpu_training_never_imports_cupy():
    code = ("import sys, layerforge\n"
            "s = layerforge.get_solver('configs/lenet_solver.yaml', max_iter=1, test_interval=0,"
            " snapshot_after_train=False)\n"
            "s.solve()\n"
            "print('cupy' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"


def test_gpu_request_without_a_device_is_one_line(tmp_path):
    try:
        import cupy  # noqa: F401
        cupy.cuda.runtime.getDeviceCount()
        import pytest
        pytest.skip("a GPU is present here")
    except Exception:  # noqa: BLE001
        pass
    proc = subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver", "configs/lenet_solver.yaml",
                           "--gpu", "0"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: solver_mode GPU (device_id 0) needs cupy and a CUDA device")


def test_array_module_dispatch():
    a = numpy.zeros(3)
    assert backend.get_array_module(a) is numpy
    assert backend.to_numpy(a) is a
    assert backend.dtype_of("float64") == numpy.float64
