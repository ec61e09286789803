"""The switch: LAYERFORGE_EMULATED_GPU=1 puts the emulator in place of cupy at ``import layerforge``, over an
installed cupy, and in every process that inherits the variable."""
import os
import subprocess
import sys

import pytest

from layerforge_emulator import install
from tests.conftest import REAL_GPU

CODE = """
import sys
import cupy  # the real one first, when installed
import layerforge
import cupy, cupy_backends.cuda.libs.cublas as cublas
from cupy.cuda import nccl
from layerforge.backend import gpu_array_module
xp = gpu_array_module(1)
print(cupy.__version__, xp is cupy, cupy.cuda.Device().id, cupy.cuda.runtime.getDeviceCount(), nccl.available,
      type(cupy.ones(2)).__module__)
"""


def run(env):
    return subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **env), cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))))


def test_the_variable_installs_the_emulator_over_a_real_cupy():
    proc = run({install.ENV: "1", "LAYERFORGE_EMULATED_GPU_DEVICES": "3"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [install.VERSION, "True", "1", "3", "True", "cupy"]


def test_installed_puts_the_previous_modules_back():
    before = {k: v for k, v in sys.modules.items() if k.split(".")[0] in install.PREFIXES}
    with install.installed() as cupy:
        import cupy.cuda.nccl
        assert sys.modules["cupy"] is cupy and install.is_installed() and cupy.cuda.nccl.available
        with pytest.raises(ModuleNotFoundError, match="not part of the emulated cupy"):
            import cupy.linalg  # noqa: F401
    assert {k: v for k, v in sys.modules.items() if k.split(".")[0] in install.PREFIXES} == before


def test_a_cpu_run_under_the_variable_never_imports_cupy():
    code = "import sys, layerforge, numpy; layerforge.Net; print('cupy' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **{install.ENV: "1"}))
    assert proc.returncode == 0 and proc.stdout.split() == ["False"], proc.stderr[-2000:]


def test_uninstalled_shows_the_world_without_the_emulator_and_puts_it_back():
    with install.installed() as emulated:
        with install.uninstalled():
            assert not install.is_installed()
            import cupy
            assert cupy is not emulated and cupy.__version__ != install.VERSION  # the installed cupy (or none)
            if not REAL_GPU:
                with pytest.raises(Exception):  # noqa: B017 - no device here: whatever the real cupy raises
                    cupy.cuda.runtime.getDeviceCount()
        assert install.is_installed() and sys.modules["cupy"] is emulated


def test_without_the_variable_layerforge_loads_no_part_of_the_emulator():
    code = ("import sys, layerforge; layerforge.Net; from layerforge.backend import get_array_module\n"
            "print(sorted(m for m in sys.modules if 'emulator' in m) or 'none')")
    env = {k: v for k, v in os.environ.items() if k != install.ENV}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0 and proc.stdout.split() == ["none"], proc.stdout + proc.stderr[-2000:]
