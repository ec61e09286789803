"""Every sparse aggregation path equals the dense sum under mpiexec -n P (see sparse_worker.py)."""
import os

import numpy
import pytest

from layerforge.blob import SparseGradient
from layerforge.comm import Communicator, CostParams, aggregate
from layerforge.comm.cost_model import choose_sparse, predict_sparse

from .mpirun import ROOT, run_mpi

WORKER = os.path.join(ROOT, "tests", "comm", "sparse_worker.py")


@pytest.mark.mpi
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_every_sparse_path_equals_dense_sum(p):
    # uneven index sets, empty sets (some ranks, all ranks), duplicates, one shared row, every row, 2-d rows
    proc = run_mpi(p, [WORKER], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"OK p={p}" in proc.stdout, proc.stdout + proc.stderr[-3000:]


@pytest.mark.mpi
@pytest.mark.parametrize("p,q", [(4, 2), (3, 2)])
def test_sharded_with_groups_aggregates_inside_the_group_first(p, q):
    proc = run_mpi(p, [WORKER, str(q)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"OK p={p}" in proc.stdout, proc.stdout + proc.stderr[-3000:]


@pytest.mark.parametrize("algorithm", ["dense", "allgather", "sharded"])
def test_one_rank_returns_its_own_rows(algorithm):
    from mpi4py import MPI
    comm = Communicator(MPI.COMM_SELF, groups=[0])
    grad = SparseGradient.coalesce(numpy.array([4, 1, 4]), numpy.arange(9.0).reshape(3, 3))
    got = aggregate(comm, grad, 6, algorithm)
    numpy.testing.assert_array_equal(got.indices, [1, 4])
    numpy.testing.assert_array_equal(got.rows, [[3, 4, 5], [6 + 0, 8, 10]])


PARAMS = CostParams(alpha=2e-6, beta_intra=2e-10, beta_inter=2e-10, gamma=1e-10)


def test_sparse_cost_model_prefers_rows_when_few_and_dense_when_all():
    row = 512 * 4
    few = [2000] * 4  # 2k of 50k rows per rank
    assert choose_sparse(few, 4000, row, 50_000, 4, PARAMS) in ("allgather", "sharded")
    assert predict_sparse("dense", few, 4000, row, 50_000, 4, PARAMS) > \
        5 * predict_sparse("sharded", few, 4000, row, 50_000, 4, PARAMS)
    every = [50_000] * 4
    assert choose_sparse(every, 50_000, row, 50_000, 4, PARAMS) == "dense"


def test_sharded_beats_allgather_when_ranks_share_rows():
    # the same 5k rows on 8 ranks: allgather receives 7 x 5k rows, sharded 2 x 5k x 7/8
    row = 650 * 4
    assert choose_sparse([5000] * 8, 5000, row, 50_000, 8, PARAMS) == "sharded"
    # one row per rank: latency decides, and allgather's log2 p steps beat the p - 1 of the Alltoallv
    assert choose_sparse([1] * 8, 8, row, 50_000, 8, PARAMS) == "allgather"
