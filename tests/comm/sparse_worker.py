"""Run under ``mpiexec -n P python tests/comm/sparse_worker.py [Q]`` by tests/comm/test_sparse.py.

Every sparse path (layerforge.comm.sparse) x case x dtype equals the dense sum of every rank's rows, computed
here by regenerating all ranks' contributions; ``OK p=P`` on rank 0 when all do. Q: groups of Q ranks.
"""
import sys

import numpy
from mpi4py import MPI

from layerforge.blob import SparseGradient
from layerforge.comm import SPARSE_ALGORITHMS, Communicator, CostParams, aggregate

NUM_ROWS = 23


def contribution(case, rank, p, dtype):
    """(indices with duplicates, rows) of ``rank`` for ``case``; uneven sizes, some ranks empty."""
    g = numpy.random.default_rng(1000 * rank + CASES.index(case))
    row_shape = (2, 3) if case == "matrix rows" else (4,)
    n = {"uneven": 3 + 5 * rank, "empty on odd ranks": 0 if rank % 2 else 6, "all empty": 0,
         "one row everywhere": 3, "matrix rows": 4, "every row": 2 * NUM_ROWS}[case]
    if case == "one row everywhere":
        indices = numpy.full(n, 7)
    elif case == "every row":
        indices = numpy.arange(n) % NUM_ROWS
    else:
        indices = g.integers(0, NUM_ROWS, n)
    return indices, g.standard_normal((n,) + row_shape).astype(dtype)


CASES = ("uneven", "empty on odd ranks", "all empty", "one row everywhere", "matrix rows", "every row")


def main(argv):
    comm = Communicator(MPI.COMM_WORLD, group_size=int(argv[1]) if len(argv) > 1 else None,
                        cost_params=CostParams(1e-5, 1e-9, 1e-9, 1e-10))
    p, failures = comm.size, 0
    for dtype in (numpy.float32, numpy.float64):
        for case in CASES:
            want_dense = None
            for r in range(p):
                indices, rows = contribution(case, r, p, numpy.float64)
                if want_dense is None:
                    want_dense = numpy.zeros((NUM_ROWS,) + rows.shape[1:])
                numpy.add.at(want_dense, indices, rows)
            union = numpy.unique(numpy.concatenate([contribution(case, r, p, dtype)[0] for r in range(p)]))
            mine = SparseGradient.coalesce(*contribution(case, comm.rank, p, dtype))
            for algorithm in SPARSE_ALGORITHMS:
                comm.reset_counters()
                got = aggregate(comm, mine, NUM_ROWS, algorithm)
                dense = numpy.zeros_like(want_dense)
                dense[got.indices] = got.rows
                tol = 1e-5 if dtype == numpy.float32 else 1e-12
                expected_rows = union if algorithm != "dense" else SparseGradient.from_dense(want_dense).indices
                ok = (got.rows.dtype == dtype and numpy.array_equal(got.indices, expected_rows)
                      and numpy.allclose(dense, want_dense, rtol=tol, atol=tol))
                if algorithm == "allgather":  # count + indices + rows (one record each) to each of the p - 1 others
                    ok = ok and sum(comm.bytes_sent.values()) == (p - 1) * (8 + mine.nbytes)
                if not ok:
                    failures += 1
                    print(f"rank {comm.rank}: {algorithm} {case} {numpy.dtype(dtype).name}: got rows "
                          f"{got.indices.tolist()}, want {expected_rows.tolist()}; bytes {comm.bytes_sent}",
                          file=sys.stderr)
    total = comm.comm.allreduce(failures)
    if comm.rank == 0 and total == 0:
        print(f"OK p={p}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
