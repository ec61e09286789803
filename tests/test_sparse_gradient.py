"""SparseGradient and the Blob's row gradients: every reader of ``diff`` sees the full gradient."""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.blob import Blob, SparseGradient


def dense_of(indices, rows, shape):
    out = numpy.zeros(shape)
    numpy.add.at(out, numpy.asarray(indices, dtype=numpy.int64), numpy.asarray(rows))
    return out


@pytest.mark.parametrize("row_shape", [(3,), (2, 2)])
@pytest.mark.parametrize("indices", [[4, 1, 4, 4, 0], [2], [], [0, 1, 2, 3, 4]])
def test_coalesce_sums_repeats_and_sorts(xp, row_shape, indices):
    rows = numpy.random.default_rng(0).standard_normal((len(indices),) + row_shape)
    grad = SparseGradient.coalesce(xp.asarray(indices, dtype=xp.int64), xp.asarray(rows))
    assert to_numpy(grad.indices).tolist() == sorted(set(indices))
    dense = xp.zeros((6,) + row_shape)
    grad.add_to(dense)
    numpy.testing.assert_allclose(to_numpy(dense), dense_of(indices, rows, (6,) + row_shape), rtol=1e-15, atol=0)
    assert grad.nbytes == 8 * len(set(indices)) + 8 * len(set(indices)) * int(numpy.prod(row_shape))


def test_blob_rows_accumulate_and_appear_in_diff(xp):
    b = Blob((5, 2), numpy.float64, xp)
    b.add_sparse_diff(xp.asarray([3, 1, 3]), xp.ones((3, 2)))
    b.add_sparse_diff(xp.asarray([1]), xp.full((1, 2), 2.0))
    grad = b.sparse_diff()
    assert to_numpy(grad.indices).tolist() == [1, 3]
    numpy.testing.assert_array_equal(to_numpy(grad.rows), [[3, 3], [2, 2]])
    numpy.testing.assert_array_equal(to_numpy(b.diff), [[0, 0], [3, 3], [0, 0], [2, 2], [0, 0]])


def test_dense_writes_and_rows_add_up(xp):
    # a shared table: one layer writes diff densely, another adds rows; sparse_diff then reads the sum
    b = Blob((4, 1), numpy.float64, xp)
    b.diff[2] += 5.0
    b.add_sparse_diff(xp.asarray([2, 0]), xp.asarray([[1.0], [4.0]]))
    grad = b.sparse_diff()
    assert to_numpy(grad.indices).tolist() == [0, 2]
    numpy.testing.assert_array_equal(to_numpy(grad.rows), [[4.0], [6.0]])
    b.set_sparse_diff(SparseGradient(xp.asarray([3]), xp.asarray([[7.0]])))
    numpy.testing.assert_array_equal(to_numpy(b.diff).ravel(), [0, 0, 0, 7])
    b.clear_diff()
    assert len(b.sparse_diff()) == 0 and not to_numpy(b.diff).any()


def test_replacing_diff_keeps_pending_rows_with_the_old_array(xp):
    # the Net swaps a frozen parameter's diff for a scratch array around backward: rows added meanwhile
    # belong to the scratch array and must not reach the kept gradient
    b = Blob((3, 1), numpy.float64, xp)
    b.add_sparse_diff(xp.asarray([0]), xp.asarray([[1.0]]))
    kept = b.diff
    b.diff = xp.zeros_like(kept)
    b.add_sparse_diff(xp.asarray([1]), xp.asarray([[9.0]]))
    scratch = b.diff
    b.diff = kept
    numpy.testing.assert_array_equal(to_numpy(b.diff).ravel(), [1, 0, 0])
    numpy.testing.assert_array_equal(to_numpy(scratch).ravel(), [0, 9, 0])


@pytest.mark.parametrize("aggregation", ["allgather", "sharded", "auto"])
def test_data_parallel_exchange_sends_the_rows_embed_added(monkeypatch, aggregation):
    # nothing may read the table's dense diff between backward and the exchange: the exchange gets the
    # rows themselves (from_dense would scan all V rows), and the table stays out of the dense buffer
    from mpi4py import MPI

    from layerforge.comm import Communicator, CostParams
    from layerforge.dataparallel.ranks import make_data_parallel
    from tests.solvers.test_sparse_update import embed_net

    from layerforge.solvers import get_solver
    solver = get_solver({"net_param": embed_net(4), "dtype": "float64", "momentum": 0.9, "iter_size": 2,
                         "sparse_aggregation": aggregation})
    solver.feed = lambda it, k: {"x": numpy.array([1.0, 1.0, 5.0, 2.0]), "label": numpy.array([0, 1, 2, 0])}
    comm = Communicator(MPI.COMM_SELF, groups=[0], cost_params=CostParams(1e-6, 1e-9, 1e-9, 1e-10))
    seams = make_data_parallel(solver, comm)
    table = solver.net.learnable_params[0]
    assert seams.dense.buffer.size == sum(p.count for p in solver.net.learnable_params[1:])

    def no_dense(dense):
        raise AssertionError("the exchange read the dense table")

    monkeypatch.setattr(SparseGradient, "from_dense", classmethod(lambda cls, dense: no_dense(dense)))
    before = table.data.copy()
    solver.step(1)
    assert seams.sparse.calls == 1
    assert seams.sparse.paths[0] in ("allgather", "sharded")
    moved = numpy.flatnonzero((table.data != before).any(axis=1)).tolist()
    assert moved == [1, 2, 5]
