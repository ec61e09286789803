"""CPU use never imports cupy; a GPU request without cupy or a device fails with one line."""
import subprocess
import sys
import time

import numpy
import pytest

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


@pytest.mark.parametrize("command, what", [
    (["train", "--solver", "configs/lenet_solver.yaml"], "solver_mode GPU"),
    (["time", "--model", "configs/lenet.yaml"], "--gpu"),
])
def test_gpu_request_without_a_device_is_one_line(command, what, no_gpu):
    proc = subprocess.run([sys.executable, "-m", "layerforge", *command, "--gpu", "0"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {what} (device_id 0) needs cupy and a CUDA device")


def test_stopwatch_times_the_work_between_start_and_stop(xp):
    watch = backend.Stopwatch(xp)
    a = xp.ones((512, 512), dtype=xp.float32)
    watch.start()
    if xp is numpy:
        time.sleep(0.05)
    for _ in range(20):
        a = a @ a / 512
    seconds = watch.stop()
    if xp is numpy:
        assert 0.05 <= seconds < 5
    else:  # device time of the 20 GEMMs (about 5 GFLOP), and stop() has waited for them
        assert 1e-6 < seconds < 5 and xp.cuda.get_current_stream().done
    assert float(a[0, 0]) == pytest.approx(1.0)


def test_array_module_dispatch():
    a = numpy.zeros(3)
    assert backend.get_array_module(a) is numpy
    assert backend.to_numpy(a) is a
    assert backend.dtype_of("float64") == numpy.float64


@pytest.mark.parametrize("env, rank", [({}, 0), ({"MPI_LOCALRANKID": "3"}, 3), ({"OMPI_COMM_WORLD_LOCAL_RANK": "1"}, 1),
                                       ({"SLURM_LOCALID": "2"}, 2)])
def test_local_rank_from_the_launchers_environment(monkeypatch, env, rank):
    from layerforge.cores import local_rank
    for var in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert local_rank() == rank


def test_each_rank_of_a_node_takes_the_next_gpu(monkeypatch):
    import types
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 4)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert [backend.rank_device(1, r) for r in range(5)] == [1, 2, 3, 0, 1]
    assert backend.rank_device(2, 0) == 2


@pytest.mark.parametrize("command", [["device_query"], ["train", "--solver", "configs/lenet_solver.yaml", "--gpu", "0"]])
def test_no_cuda_device_is_one_line_saying_so_and_what_gpu_needs(command, no_gpu):
    # this machine's cupy finds no usable driver (cudaErrorInsufficientDriver); a machine without cupy cannot import it
    proc = subprocess.run([sys.executable, "-m", "layerforge", *command], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and ("no CUDA device was found (" in lines[0] or "cupy cannot be imported (" in lines[0])
    assert lines[0].endswith(f"; {backend.GPU_NEEDS}"), lines[0]


class CUDARuntimeError(RuntimeError):
    """cupy's exception, as its driver check raises it (the tests need no cupy)."""


@pytest.mark.parametrize("error, found", [
    (ImportError("No module named 'cupy'"), "cupy cannot be imported (ImportError: No module named 'cupy')"),
    (CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version"),
     "no CUDA device was found (cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime "
     "version)"),
    (CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected"),
     "no CUDA device was found (cudaErrorNoDevice: no CUDA-capable device is detected)"),
])
def test_no_device_names_what_was_missing_and_what_gpu_needs(error, found):
    assert backend.no_device("--gpu (device_id 0)", error, 0) == \
        f"--gpu (device_id 0) needs cupy and a CUDA device: {found}; {backend.GPU_NEEDS}"
    other = CUDARuntimeError("cudaErrorMemoryAllocation: out of memory")
    assert backend.no_device("--gpu", other) == \
        "--gpu needs cupy and a CUDA device: CUDARuntimeError: cudaErrorMemoryAllocation: out of memory"
