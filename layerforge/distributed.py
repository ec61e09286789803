"""Synchronous data parallelism over MPI ranks, mathematically the same as one process with the total batch.

``mpiexec -n P layerforge train --solver S`` runs P replicas. Each reads a disjoint shard of the data with
batch b; after the iter_size passes every rank's summed gradients are packed into one contiguous buffer
(or size-capped buckets), summed by the chosen allreduce and divided by P; then each rank normalises,
clips, regularises and updates identically. P ranks x batch b therefore reach the parameters of one rank
x batch P*b (ChainerMN / Parallax semantics): clipping sees the aggregated gradient, the update happens once.

Also here: parameters broadcast from rank 0 at start, a configuration hash checked across ranks, a check
that parameters still agree at every snapshot, test scores summed over the ranks' test shards, and signal
requests agreed on so that every rank stops or snapshots at the same iteration.
"""
import hashlib
import json
import logging
import os
import time

import numpy

from . import backend
from .errors import LayerforgeError

log = logging.getLogger("layerforge")

_ACTIONS = ("none", "snapshot", "stop")


def mpi_world_size():
    """The process count of the MPI job this process was started in (1 when not under mpiexec/srun)."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


class GradientExchange:
    """The gradient hook: pack all learnable diffs, allreduce-average them, unpack.

    Args:
        params: the learnable Blobs (``net.learnable_params``).
        comm: a :class:`~layerforge.comm.Communicator`.
        algorithm: an allreduce name (``auto``, ``recursive``, ``topology``, ``ring``, ``doubling``, ``mpi``, ``nccl``).
        bucket_bytes: cap on one allreduce message (0: one buffer for everything).
        fp16: send float16 payloads (values are divided by P before the sum so they cannot overflow).
    """

    def __init__(self, params, comm, algorithm="auto", bucket_bytes=0, fp16=False):
        self.params, self.comm, self.algorithm = list(params), comm, algorithm
        self.fp16 = fp16
        dtype = numpy.float16 if fp16 else (params[0].data.dtype if params else numpy.float32)
        self.offsets = numpy.cumsum([0] + [p.count for p in self.params])
        self.buffer = numpy.zeros(int(self.offsets[-1]), dtype)
        self.buckets = self._buckets(bucket_bytes)
        self.seconds = 0.0  # time spent in the exchange, summed over calls
        self.calls = 0

    def _buckets(self, bucket_bytes):
        # the packed buffer is contiguous, so buckets are plain slices of it, each at most bucket_bytes
        n = self.buffer.size
        cap = int(bucket_bytes // self.buffer.itemsize) if bucket_bytes else n
        cap = max(1, cap)
        return [(lo, min(lo + cap, n)) for lo in range(0, n, cap)]

    def __call__(self, solver=None):
        t0 = time.perf_counter()
        P = self.comm.size
        for p, lo, hi in zip(self.params, self.offsets[:-1], self.offsets[1:]):
            self.buffer[lo:hi] = backend.to_numpy(p.diff).reshape(-1)
        if self.fp16:
            self.buffer /= numpy.float16(P)
        for lo, hi in self.buckets:
            self.comm.allreduce(self.buffer[lo:hi], algorithm=self.algorithm)
        if not self.fp16:
            self.buffer /= self.buffer.dtype.type(P)
        for p, lo, hi in zip(self.params, self.offsets[:-1], self.offsets[1:]):
            p.diff[...] = p.xp.asarray(self.buffer[lo:hi].reshape(p.shape), dtype=p.dtype)
        self.seconds += time.perf_counter() - t0
        self.calls += 1


class SparseGradientExchange:
    """The gradient hook for parameters whose gradient comes as rows (Embed): each parameter's rows are summed
    by a path of :mod:`layerforge.comm.sparse` and divided by P; the dense exchange leaves these out.

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

    def __call__(self, solver=None):
        from .comm.sparse import aggregate
        t0 = time.perf_counter()
        for k, p in enumerate(self.params):
            grad = p.sparse_diff()
            summed = aggregate(self.comm, grad, p.shape[0], self.paths[k] or "allgather", self.allreduce)
            if self.paths[k] is None:
                self.paths[k] = self._choose(k, p, grad, summed)
            summed.rows /= summed.rows.dtype.type(self.comm.size)
            p.set_sparse_diff(summed)
        self.seconds += time.perf_counter() - t0
        self.calls += 1

    def _choose(self, k, p, grad, summed):
        from .comm import cost_model
        comm = self.comm
        if comm.cost_params is None:
            comm.cost_params = cost_model.load_or_calibrate(comm)
        counts = numpy.empty(comm.size, numpy.int64)
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


def pack(blobs, what="data"):
    """All ``blob.<what>`` arrays as one contiguous float64 host vector."""
    if not blobs:
        return numpy.zeros(0)
    return numpy.concatenate([backend.to_numpy(getattr(b, what)).astype(numpy.float64).reshape(-1) for b in blobs])


def broadcast_parameters(comm, net, root=0):
    """Copy every parameter blob of ``net`` (learnable and statistics) from ``root`` to all ranks."""
    blobs = [b for layer in net.layers for b in layer.blobs]
    seen, unique = set(), []
    for b in blobs:
        if id(b) not in seen:
            seen.add(id(b))
            unique.append(b)
    if not unique:
        return
    flat = numpy.concatenate([backend.to_numpy(b.data).reshape(-1) for b in unique]).astype(unique[0].dtype)
    comm.bcast(flat, root=root)
    offset = 0
    for b in unique:
        b.data[...] = b.xp.asarray(flat[offset:offset + b.count].reshape(b.shape))
        offset += b.count


def _allgather_digest(comm, digest):
    mine = numpy.frombuffer(digest, dtype=numpy.uint8).copy()
    everyone = numpy.zeros((comm.size, mine.size), numpy.uint8)
    comm.comm.Allgather(mine, everyone)
    return [bytes(row) for row in everyone]


def check_same(comm, digest, what):
    """Raise (on every rank) naming the first rank whose ``digest`` differs from rank 0's."""
    digests = _allgather_digest(comm, digest)
    for r, d in enumerate(digests):
        if d != digests[0]:
            raise LayerforgeError(f"rank {r} has a different {what} than rank 0 "
                                  f"({d.hex()[:12]} vs {digests[0].hex()[:12]})")


def config_digest(sp, overrides):
    """sha256 over the solver file, the net files it names, and the command-line overrides."""
    h = hashlib.sha256()
    paths = [sp.path] + [sp.resolve(p) for p in [sp.net, sp.train_net, *sp.test_net] if p]
    for path in paths:
        if path and os.path.exists(path):
            with open(path, "rb") as f:
                h.update(f.read())
    for inline in (sp.net_param, sp.train_net_param, sp.test_net_param):
        if inline:
            h.update(json.dumps(inline, sort_keys=True, default=str).encode())
    h.update(json.dumps(overrides, sort_keys=True, default=str).encode())
    return h.digest()


def parameters_digest(net):
    return hashlib.sha256(pack([b for layer in net.layers for b in layer.blobs]).tobytes()).digest()


def make_data_parallel(solver, comm, algorithm=None, digest=None):
    """Attach data-parallel training over ``comm`` to a Solver built with ``shard=(comm.rank, comm.size)``.

    Returns the :class:`GradientExchange` (its ``seconds`` tell the time spent communicating). Parameters
    with row gradients (Embed) go through ``solver.sparse_exchange`` (a :class:`SparseGradientExchange`)
    unless ``sparse_aggregation`` is ``dense``.
    """
    sp = solver.param
    if digest is not None:
        check_same(comm, digest, "configuration (solver or net files, or command-line options)")
    broadcast_parameters(comm, solver.net)
    params = solver.net.learnable_params
    rows = [p for p in params if p.sparse_rows] if sp.sparse_aggregation != "DENSE" else []
    exchange = GradientExchange([p for p in params if not any(p is q for q in rows)], comm,
                                algorithm or sp.allreduce.lower(), bucket_bytes=int(sp.allreduce_bucket_mb * 2 ** 20),
                                fp16=sp.allreduce_fp16)
    solver.gradient_hooks.append(exchange)
    solver.sparse_exchange = None
    if rows:
        solver.sparse_exchange = SparseGradientExchange(rows, comm, sp.sparse_aggregation.lower(),
                                                        algorithm or sp.allreduce.lower())
        solver.gradient_hooks.append(solver.sparse_exchange)
    solver.root = comm.rank == 0

    def test_reduce(sums, loss, n):
        flat = numpy.concatenate([numpy.asarray(s, numpy.float64).reshape(-1) for s in sums or []] + [[loss, n]])
        comm.allreduce(flat, algorithm="mpi")
        out, offset = [], 0
        for s in sums or []:
            out.append(flat[offset:offset + s.size].reshape(s.shape))
            offset += s.size
        return out, float(flat[-2]), int(round(flat[-1]))

    def agree_action(action):
        # the most drastic request of any rank wins: stop > snapshot > none
        from mpi4py import MPI
        code = numpy.array([_ACTIONS.index(action)], numpy.int32)
        comm.comm.Allreduce(MPI.IN_PLACE, code, op=MPI.MAX)
        return _ACTIONS[int(code[0])]

    def check_agreement(_solver):
        check_same(comm, parameters_digest(solver.net), f"set of parameters at iteration {solver.iter}")

    solver.test_reduce = test_reduce if solver.test_nets else None
    solver.agree_action = agree_action
    solver.snapshot_hooks.append(check_agreement)
    log.info("Data parallel over %d ranks (%d node group(s)): allreduce %s, %d gradient values in %d bucket(s)%s",
             comm.size, comm.num_groups, exchange.algorithm, exchange.buffer.size, len(exchange.buckets),
             ", float16 payload" if exchange.fp16 else "")
    if rows:
        log.info("%d parameter(s) with row gradients (%s) left out of the allreduce: sparse aggregation %s",
                 len(rows), ", ".join(p.name or "?" for p in rows), solver.sparse_exchange.algorithm)
    return exchange

