"""Launch ``mpiexec -n P python ...`` from a test: the mpiexec next to the interpreter (the mpich wheel's
hydra), else the one on PATH. Hydra runs more ranks than cores without an --oversubscribe flag."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "comm", "mpi_worker.py")
SEGMENTS_TO = "LAYERFORGE_TEST_SEGMENTS"  # the worker's ranks write the MPICH shared-memory files they map there


def mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.access(here, os.X_OK) else shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec")
    return found


def run_mpi(p, args, timeout=60, env=None):
    """Run ``mpiexec -n p python args...`` with the repository importable; returns the CompletedProcess."""
    full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    **(env or {}))
    full_env.pop("LAYERFORGE_GROUP_SIZE", None)
    return subprocess.run([mpiexec(), "-n", str(p), sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)
