import os
import subprocess
import sys

from tests.comm.mpirun import run_mpi

# one os.write per process: ranks share the pipe, and a single small write is never interleaved
CODE = ("import os, layerforge; os.write(1, f\"{os.environ.get('OMP_NUM_THREADS')} "
        "{os.environ.get('OPENBLAS_NUM_THREADS')}\\n\".encode())")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(extra)
    return env


def test_ranks_share_the_cores_of_a_node():
    proc = run_mpi(2, ["-c", CODE], env=None)
    expected = str(max(1, (os.cpu_count() or 1) // 2))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [expected] * 4


def test_single_process_and_user_settings_are_left_alone():
    env = clean_env()
    for var in ("PMI_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        env.pop(var, None)
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env).stdout
    assert out.split() == ["None", "None"]
    env.update(MPI_LOCALNRANKS="4", OMP_NUM_THREADS="3")
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env).stdout
    assert out.split() == ["3", "None"]
