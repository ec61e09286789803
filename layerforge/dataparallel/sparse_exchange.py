"""The exchange of row gradients (Embed's) over MPI ranks: :class:`SparseGradientExchange`, each parameter's rows
summed by a path of :mod:`layerforge.comm.sparse` that the cost model picks from the first iteration's density."""
import logging
import time

import numpy

from .. import trace
from ..solvers.seam import Seam

log = logging.getLogger("layerforge")


class SparseGradientExchange(Seam):
    """The exchange of the parameters whose gradient comes as rows (Embed), before the update: each parameter's rows
    are summed by a path of :mod:`layerforge.comm.sparse` and divided by P; the dense exchange leaves these out.

    ``auto`` aggregates the first iteration by allgather, which tells every rank how many rows each rank
    had and how many the sum has; from that density the cost model (``predict_sparse``) picks the path
    used from then on, the same on every rank, logged once per parameter.

    Args:
        params: the learnable Blobs with ``sparse_rows``. comm: a Communicator.
        algorithm: ``allgather``, ``sharded``, ``dense`` or ``auto``. allreduce: the dense path's allreduce.
    """

    def __init__(self, params, comm, algorithm="auto", allreduce="auto", names=None):
        self.params, self.comm, self.algorithm, self.allreduce = list(params), comm, algorithm, allreduce
        self.names = names or [p.name or f"parameter {k}" for k, p in enumerate(self.params)]
        self.paths = [None if algorithm == "auto" else algorithm for _ in self.params]
        self.seconds, self.calls = 0.0, 0

    def before_update(self):
        from ..comm.sparse import aggregate
        t0 = time.perf_counter()
        for k, p in enumerate(self.params):
            grad = p.sparse_diff()
            with trace.wait("comm", f"sparse {k}", algorithm=self.paths[k] or "allgather"):
                with self.comm.collective("sparse aggregation"):
                    summed = aggregate(self.comm, grad, p.shape[0], self.paths[k] or "allgather", self.allreduce)
            if self.paths[k] is None:
                self.paths[k] = self._choose(k, p, grad, summed)
            summed.rows /= summed.rows.dtype.type(self.comm.size)
            p.set_sparse_diff(summed)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return True

    def _choose(self, k, p, grad, summed):
        from ..comm import cost_model
        comm = self.comm
        if comm.cost_params is None:
            comm.cost_params = cost_model.load_or_calibrate(comm)
        counts = numpy.empty(comm.size, numpy.int64)
        with comm.collective("allgather of the row counts"):
            comm.comm.Allgather(numpy.array([len(grad)], numpy.int64), counts)
        row_bytes = int(numpy.prod(p.shape[1:], dtype=numpy.int64)) * p.dtype.itemsize
        args = (counts.tolist(), len(summed), row_bytes, p.shape[0], comm.group_size, comm.cost_params)
        path = cost_model.choose_sparse(*args)
        if comm.rank == 0:
            times = ", ".join(f"{name} {cost_model.predict_sparse(name, *args) * 1e3:.3g} ms"
                              for name in cost_model.SPARSE_PATHS)
            log.info("Sparse aggregation of %s: %d of %d rows per rank at most, %d in the sum (density %.3g): "
                     "%s chosen (predicted %s)", self.names[k], max(counts), p.shape[0], len(summed),
                     len(summed) / p.shape[0], path, times)
        return path
