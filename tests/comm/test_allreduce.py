"""Every allreduce algorithm equals the numpy sum under mpiexec -n P (see mpi_worker.py ``sums``)."""
import pytest

from .mpirun import WORKER, run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
def test_every_algorithm_equals_numpy_sum(p):
    # lengths 1, 2, 3, p-1, p+1, 1000, 4099 (float16/32/64), 999_999 (float32); in place and out of place;
    # random float64 too; mean and bcast
    proc = run_mpi(p, [WORKER, "sums"], timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"OK p={p}" in proc.stdout, proc.stdout + proc.stderr[-3000:]


@pytest.mark.mpi
@pytest.mark.parametrize("p,q", [(4, 2), (5, 2), (6, 3), (8, 3)])
def test_every_algorithm_equals_numpy_sum_over_groups(p, q):
    # groups of q ranks (the last one smaller when q does not divide p): the hierarchical algorithm's
    # in-group trees and its leaders' exchange, and the group-aware schedules of the others
    proc = run_mpi(p, [WORKER, "sums", str(q)], timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"OK p={p}" in proc.stdout, proc.stdout + proc.stderr[-3000:]
