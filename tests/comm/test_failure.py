"""A rank that raises, or is killed, ends the whole job non-zero within 30 s, naming the rank."""
import time

import pytest

from .mpirun import WORKER, run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("p", [2, 4])
def test_raising_rank_aborts_job(p):
    t0 = time.monotonic()
    proc = run_mpi(p, [WORKER, "raise"], timeout=30)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 30
    assert "rank 1: ValueError: boom" in proc.stderr


@pytest.mark.mpi
def test_killed_rank_ends_job():
    t0 = time.monotonic()
    proc = run_mpi(4, [WORKER, "kill"], timeout=30)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 30
