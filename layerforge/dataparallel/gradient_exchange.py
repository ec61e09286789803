"""Synchronous data parallelism over MPI ranks, mathematically the same as one process with the total batch.

``mpiexec -n P layerforge train --solver S`` runs P replicas. Each reads a disjoint shard of the data with
batch b; every rank's summed gradients are packed into size-capped buckets of one contiguous buffer, summed
by the chosen allreduce (bucket by bucket during the last backward pass with ``allreduce_overlap``, the
default; after it otherwise) and divided by P; then each rank normalises, clips, regularises and updates
identically. P ranks x batch b therefore reach the parameters of one rank
x batch P*b (ChainerMN / Parallax semantics): clipping sees the aggregated gradient, the update happens once.

Also here: parameters broadcast from rank 0 at start, a configuration hash checked across ranks, and the ranks'
agreement (:class:`RankAgreement`): a check that parameters still agree at every snapshot, test scores summed
over the ranks' test shards, and signal requests agreed on so that every rank stops or snapshots at the same
iteration. Each of these is a :class:`~layerforge.solvers.seam.Seam` that :func:`make_data_parallel` gives the
solver.
"""
import collections
import contextlib
import hashlib
import json
import logging
import os
import time

import numpy

from .. import backend, trace
from ..errors import LayerforgeError
from ..solvers.seam import Seam

log = logging.getLogger("layerforge")

_ACTIONS = ("none", "snapshot", "stop")


class GradientExchange(Seam):
    """The dense gradient exchange: pack the learnable diffs into buckets, allreduce-average them, unpack.

    The packed buffer holds the parameters in the order backward finishes them (the last layer's first) and
    is cut into buckets of at most ``bucket_bytes``. Without overlap every bucket is packed and allreduced
    before the update (:meth:`before_update`). With ``overlap`` (``allreduce_overlap: true``),
    :meth:`layer_gradients_ready` runs after every layer's backward during the last iter_size pass, and a
    bucket leaves as soon as the layers that write its parameters are done: the project's algorithms on one
    communication thread (one collective at a time, in the same bucket order on every rank), ``mpi`` as a
    non-blocking ``Iallreduce`` posted by the training thread and driven by ``Testall`` after each later layer.
    :meth:`before_update` then waits only for what is still in flight. Both ways run the same allreduce calls
    on the same buckets, so their results are bit-identical.

    ``double_buffering`` (ChainerMN): the exchange of iteration t's gradients runs while iteration t + 1
    computes, and the update of iteration t + 1 uses them; iteration 0 makes no update (it only starts the
    first exchange), and the last iteration's gradients are never applied. A different optimiser: the
    update sees gradients one step stale.

    Args:
        params: the learnable Blobs to exchange (``net.learnable_params`` less row-gradient ones).
        comm: a :class:`~layerforge.comm.Communicator`.
        algorithm: an allreduce name (``auto``, ``recursive``, ``topology``, ``ring``, ``doubling``,
            ``hierarchical``, ``mpi``, ``nccl``).
        bucket_bytes: cap on one allreduce message (0: one buffer for everything).
        fp16: send float16 payloads (values are divided by P before the sum so they cannot overflow).
        ready_after: per parameter, the layer index after whose backward its diff is final (the smallest
            index of the layers holding it); None: all at the end (no overlap possible).
        names: per parameter, the name of the layer holding it (the trace names each bucket's layers).
        overlap, double_buffering: as above.
        iter_size: the solver's passes per iteration (the last one's backward sends the buckets).

    Attributes:
        seconds: wall time inside before_update, summed (packing, waiting, unpacking).
        comm_seconds: time the allreduce calls themselves took, summed (on whichever thread ran them).
        exposed_seconds: time the training thread waited for communication after backward, summed.
    """

    def __init__(self, params, comm, algorithm="auto", bucket_bytes=0, fp16=False, ready_after=None,
                 overlap=False, double_buffering=False, names=None, iter_size=1):
        params = list(params)
        names = list(names) if names is not None else [""] * len(params)
        ready_after = list(ready_after) if ready_after is not None else [0] * len(params)
        order = sorted(range(len(params)), key=lambda k: -ready_after[k])  # stable: backward order
        self.params = [params[k] for k in order]
        self.ready_after = [ready_after[k] for k in order]
        self.comm, self.algorithm, self.fp16 = comm, algorithm, fp16
        self.overlap, self.double_buffering, self.iter_size = overlap, double_buffering, iter_size
        self.layer_hooks = overlap or double_buffering  # the buckets' sends and MPI's progress run per layer
        dtype = numpy.float16 if fp16 else (params[0].data.dtype if params else numpy.float32)
        self.offsets = numpy.cumsum([0] + [p.count for p in self.params])
        self.buffer = numpy.zeros(int(self.offsets[-1]), dtype)
        self.buckets = self._buckets(bucket_bytes)
        # a bucket may leave once every parameter overlapping it is final: after the smallest ready index
        self.bucket_ready = [min(r for r, lo, hi in zip(self.ready_after, self.offsets[:-1], self.offsets[1:])
                                 if lo < b_hi and hi > b_lo) for b_lo, b_hi in self.buckets]
        names = [names[k] for k in order]
        self.bucket_layers = [list(dict.fromkeys(n for n, lo, hi in zip(names, self.offsets[:-1], self.offsets[1:])
                                                 if lo < b_hi and hi > b_lo and n)) for b_lo, b_hi in self.buckets]
        self.seconds = self.comm_seconds = self.exposed_seconds = 0.0
        self.calls = 0
        self.armed = False  # True during the backward whose gradients are exchanged (the last iter_size pass)
        self._launched = 0
        self._pending = []  # futures (own algorithms) or requests (mpi) of launched buckets
        self._thread = None
        self._stale = None  # double buffering: the exchange started last iteration
        # a GPU replica's device: the communication thread starts on device 0, whatever this rank uses
        xp = params[0].xp if params else numpy
        self._device = xp.cuda.Device() if xp is not numpy else None

    def _buckets(self, bucket_bytes):
        # the packed buffer is contiguous, so buckets are plain slices of it, each at most bucket_bytes
        n = self.buffer.size
        cap = int(bucket_bytes // self.buffer.itemsize) if bucket_bytes else n
        cap = max(1, cap)
        return [(lo, min(lo + cap, n)) for lo in range(0, n, cap)]

    # -- sending ----------------------------------------------------------------------------------------
    def _pack(self, b_lo, b_hi):
        for p, lo, hi in zip(self.params, self.offsets[:-1], self.offsets[1:]):
            if lo < b_hi and hi > b_lo:
                part = backend.to_numpy(p.diff).reshape(-1)[max(lo, b_lo) - lo:min(hi, b_hi) - lo]
                self.buffer[max(lo, b_lo):min(hi, b_hi)] = part
        if self.fp16:
            self.buffer[b_lo:b_hi] /= numpy.float16(self.comm.size)

    def _bucket_args(self, k):
        b_lo, b_hi = self.buckets[k]
        return dict(algorithm=self.algorithm, bytes=int((b_hi - b_lo) * self.buffer.itemsize),
                    layers=self.bucket_layers[k])

    def _allreduce(self, k, inline=False):
        b_lo, b_hi = self.buckets[k]
        t0 = time.perf_counter()
        # inline, the training thread itself waits for the allreduce: exposed time, as the trace counts it
        spanned = trace.wait if inline else trace.span
        with spanned("comm", f"bucket {k}", **self._bucket_args(k)), self._device or contextlib.nullcontext():
            self.comm.allreduce(self.buffer[b_lo:b_hi], algorithm=self.algorithm)
        self.comm_seconds += time.perf_counter() - t0

    def _launch(self, k):
        b_lo, b_hi = self.buckets[k]
        self._pack(b_lo, b_hi)
        if not (self.overlap or self.double_buffering):
            self._allreduce(k, inline=True)
        elif self.algorithm == "mpi":
            from mpi4py import MPI
            request = self.comm.comm.Iallreduce(MPI.IN_PLACE, self.buffer[b_lo:b_hi], op=MPI.SUM)
            self._pending.append((time.perf_counter(), request, k))
        else:
            if self._thread is None:
                from concurrent.futures import ThreadPoolExecutor
                self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="layerforge-comm")
            self._pending.append(self._thread.submit(self._allreduce, k))

    def layer_gradients_ready(self, i):
        """After layer ``i``'s backward: send every bucket whose parameters are now final (when armed), and
        let MPI progress the non-blocking allreduces in flight."""
        while self.armed and self._launched < len(self.buckets) and self.bucket_ready[self._launched] >= i:
            self._launch(self._launched)
            self._launched += 1
        if self._pending and self.algorithm == "mpi":
            from mpi4py import MPI
            MPI.Request.Testall([r for _, r, _ in self._pending])  # drives the non-blocking allreduces on

    def _wait(self):
        if self.algorithm == "mpi" and self._pending:
            from mpi4py import MPI
            started = self._pending[0][0]
            MPI.Request.Waitall([r for _, r, _ in self._pending])
            done = time.perf_counter()
            self.comm_seconds += done - started
            for posted, _, k in self._pending:  # the library progressed them somewhere: posted until waited for
                trace.complete("comm", f"bucket {k}", posted, done - posted, self._bucket_args(k), thread="comm")
        else:
            for future in self._pending:
                future.result()
        self._pending = []

    def _finish(self):
        """Wait for the launched buckets, average, and write the diffs back."""
        t0 = time.perf_counter()
        with trace.wait("comm"):
            self._wait()
        self.exposed_seconds += time.perf_counter() - t0
        if not self.fp16:
            self.buffer /= self.buffer.dtype.type(self.comm.size)
        for p, lo, hi in zip(self.params, self.offsets[:-1], self.offsets[1:]):
            p.diff[...] = p.xp.asarray(self.buffer[lo:hi].reshape(p.shape), dtype=p.dtype)

    # -- the seam ----------------------------------------------------------------------------------------
    def before_update(self):
        """Send what is left, wait, and leave the mean over the ranks in the diffs; False at double buffering's
        first iteration (nothing exchanged yet to apply)."""
        t0 = time.perf_counter()
        self.armed = False
        update = True
        if self.double_buffering:
            update = self._swap_with_stale()
        else:
            comm_before = self.comm_seconds
            while self._launched < len(self.buckets):
                self._launch(self._launched)
                self._launched += 1
            if not self.overlap:  # the allreduces ran right here, all of them exposed
                self.exposed_seconds += self.comm_seconds - comm_before
            self._finish()
        self._launched = 0
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return update

    def _swap_with_stale(self):
        # this iteration's gradients go out now; the update applies the ones that went out last iteration
        fresh = [p.diff.copy() for p in self.params]
        update = self._stale is not None  # iteration 0: nothing exchanged yet to apply
        if update:
            self._finish()  # waits for last iteration's exchange and writes its mean into the diffs
        else:
            for p in self.params:
                p.diff[...] = 0
        self._stale = fresh
        saved = [p.diff for p in self.params]
        for p, g in zip(self.params, fresh):
            p.diff = g  # packed from the fresh gradients, while the diffs hold the stale mean for the update
        for k in range(len(self.buckets)):
            self._launch(k)
        for p, d in zip(self.params, saved):
            p.diff = d
        return update

    def before_pass(self, k):
        """Arm the per-layer sends for the last of the iter_size passes."""
        self.armed = self.overlap and k == self.iter_size - 1

    def describe(self, seconds_per_iter, iters):
        """One display line: communication and its exposed part per iteration since the last call."""
        comm = (self.comm_seconds - getattr(self, "_logged_comm", 0.0)) / max(iters, 1)
        exposed = (self.exposed_seconds - getattr(self, "_logged_exposed", 0.0)) / max(iters, 1)
        self._logged_comm, self._logged_exposed = self.comm_seconds, self.exposed_seconds
        share = 100.0 * exposed / seconds_per_iter if seconds_per_iter else 0.0
        mode = "double buffering" if self.double_buffering else ("overlapped" if self.overlap else "after backward")
        return [f"comm exposed {exposed * 1000:.3g} ms of {comm * 1000:.3g} ms per iteration "
                f"({share:.3g}% of the iteration; {mode})"]


def holder_names(net, params):
    """Per blob of ``params``: the name of the first layer holding it."""
    return [net.layers[i].name for i in gradient_ready_after(net, params)]


def gradient_ready_after(net, params):
    """Per blob of ``params``: the index of the first layer holding it (its diff is final after that
    layer's backward, which runs last among its holders)."""
    first = {}
    for i, layer in enumerate(net.layers):
        for b in layer.blobs:
            first.setdefault(id(b), i)
    return [first.get(id(p), 0) for p in params]


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
    """sha256 of the learnable parameters. Not of statistics blobs: each rank's BatchNorm running mean and
    variance follow its own batches (as in Caffe's multi-GPU training and PyTorch DDP without SyncBatchNorm),
    so they differ between ranks; rank 0's are the ones snapshotted. Blobs with lr_mult 0 (BatchNorm's
    statistics among them) are left out for that reason."""
    trained = [p for p, lr in zip(net.learnable_params, net.params_lr) if lr]
    return hashlib.sha256(pack(trained).tobytes()).digest()


class RankAgreement(Seam):
    """What keeps the ranks of one job one training run: rank 0 is the root (it displays and snapshots), every rank
    tests its shard and the test outputs are summed over the ranks, every rank acts on the most drastic signal
    request of any rank (stop > snapshot > none), and before a snapshot all ranks check that their parameters are
    still the same.

    Args:
        comm: a :class:`~layerforge.comm.Communicator`. solver: the rank's Solver (its net and iteration are read).
    """

    shares_tests = True

    def __init__(self, comm, solver):
        self.comm, self.solver = comm, solver
        self.root = comm.rank == 0

    def reduce_test(self, sums, loss, n):
        flat = numpy.concatenate([numpy.asarray(s, numpy.float64).reshape(-1) for s in sums or []] + [[loss, n]])
        self.comm.allreduce(flat, algorithm="mpi")
        out, offset = [], 0
        for s in sums or []:
            out.append(flat[offset:offset + s.size].reshape(s.shape))
            offset += s.size
        return out, float(flat[-2]), int(round(flat[-1]))

    def agree(self, action):
        from mpi4py import MPI

        code = numpy.array([_ACTIONS.index(action)], numpy.int32)
        self.comm.comm.Allreduce(MPI.IN_PLACE, code, op=MPI.MAX)
        return _ACTIONS[int(code[0])]

    def before_snapshot(self):
        check_same(self.comm, parameters_digest(self.solver.net), f"set of parameters at iteration {self.solver.iter}")


class RankSeams(collections.namedtuple("RankSeams", "dense sparse ranks")):
    """What :func:`make_data_parallel` gave a solver: the :class:`GradientExchange`, the
    :class:`SparseGradientExchange` (None without row gradients) and the :class:`RankAgreement`."""


def make_data_parallel(solver, comm, algorithm=None, digest=None):
    """Train ``solver`` (built with ``shard=(comm.rank, comm.size)``) data parallel over ``comm``: check that the
    ranks run one configuration (``digest``, :func:`config_digest`), broadcast rank 0's parameters, and give the
    solver the seams of this module (:meth:`~layerforge.solvers.Solver.add_seam`) in the order they act.

    Parameters with row gradients (Embed) go through a :class:`SparseGradientExchange` unless ``sparse_aggregation``
    is ``dense``. Returns the :class:`RankSeams` (the exchanges' ``seconds`` tell the time spent communicating).
    """
    sp = solver.param
    if digest is not None:
        check_same(comm, digest, "configuration (solver or net files, or command-line options)")
    broadcast_parameters(comm, solver.net)
    params = solver.net.learnable_params
    # double buffering delays every gradient by one iteration, the row gradients too: they go dense
    rows = [p for p in params if p.sparse_rows] if sp.sparse_aggregation != "DENSE" and not sp.double_buffering else []
    dense = [p for p in params if not any(p is q for q in rows)]
    overlap = sp.allreduce_overlap and not sp.double_buffering
    exchange = GradientExchange(dense, comm, algorithm or sp.allreduce.lower(),
                                bucket_bytes=int(sp.allreduce_bucket_mb * 2 ** 20), fp16=sp.allreduce_fp16,
                                ready_after=gradient_ready_after(solver.net, dense), overlap=overlap,
                                double_buffering=sp.double_buffering, names=holder_names(solver.net, dense),
                                iter_size=sp.iter_size)
    solver.add_seam(exchange)
    sparse = None
    if rows:
        sparse = SparseGradientExchange(rows, comm, sp.sparse_aggregation.lower(), algorithm or sp.allreduce.lower())
        solver.add_seam(sparse)
    ranks = RankAgreement(comm, solver)
    solver.add_seam(ranks)
    mode = ("double buffering (updates use the previous iteration's gradients)" if sp.double_buffering else
            "overlapped with backward" if overlap else "after backward")
    log.info("Data parallel over %d ranks (%d node group(s)): allreduce %s, %d gradient values in %d bucket(s)%s, %s",
             comm.size, comm.num_groups, exchange.algorithm, exchange.buffer.size, len(exchange.buckets),
             ", float16 payload" if exchange.fp16 else "", mode)
    if rows:
        log.info("%d parameter(s) with row gradients (%s) left out of the allreduce: sparse aggregation %s",
                 len(rows), ", ".join(p.name or "?" for p in rows), sparse.algorithm)
    return RankSeams(exchange, sparse, ranks)
