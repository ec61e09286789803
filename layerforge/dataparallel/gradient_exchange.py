"""The dense gradient exchange of synchronous data parallelism over MPI ranks (:class:`GradientExchange`).

Every rank's summed gradients are packed into size-capped buckets of one contiguous buffer, summed by the chosen
allreduce (bucket by bucket during the last backward pass with ``allreduce_overlap``, the default; after it
otherwise) and divided by P; then each rank normalises, clips, regularises and updates identically. P ranks x
batch b therefore reach the parameters of one rank x batch P*b (ChainerMN / Parallax semantics): clipping sees
the aggregated gradient, the update happens once. :mod:`.ranks` gives a solver this exchange with the others.
"""
import contextlib
import time

import numpy

from .. import backend, trace
from ..solvers.seam import Seam


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
        comm_seconds: per iteration, the time some allreduce was in progress or the training thread waited for one
            (the union of those intervals, as ``layerforge trace summary`` counts comm), summed.
        exposed_seconds: the part of it the training thread spent in communication (running an allreduce itself,
            or waiting for buckets in flight), summed: never more than comm_seconds.
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
        self._spans = []  # this exchange's (start, end, on the training thread) intervals of communication
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
    def _pack(self, b_lo, b_hi, diffs=None):
        # diffs: the arrays to pack in place of the parameters' diffs (double buffering's fresh gradients)
        for k, (p, lo, hi) in enumerate(zip(self.params, self.offsets[:-1], self.offsets[1:])):
            if lo < b_hi and hi > b_lo:
                diff = p.diff if diffs is None else diffs[k]
                part = backend.to_numpy(diff).reshape(-1)[max(lo, b_lo) - lo:min(hi, b_hi) - lo]
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
        self._spans.append((t0, time.perf_counter(), inline))

    def _launch(self, k, diffs=None):
        b_lo, b_hi = self.buckets[k]
        self._pack(b_lo, b_hi, diffs)
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
            with self.comm.collective("allreduce"):
                MPI.Request.Waitall([r for _, r, _ in self._pending])
            done = time.perf_counter()
            self._spans.append((started, done, False))
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
        self._spans.append((t0, time.perf_counter(), True))
        self._count_spans()
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
            while self._launched < len(self.buckets):
                self._launch(self._launched)
                self._launched += 1
            self._finish()
        self._launched = 0
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return update

    def _count_spans(self):
        """Add the exchange just waited for to comm_seconds and exposed_seconds: the union of its intervals, and of
        those on the training thread (a subset, so exposed never exceeds comm)."""
        from ..trace.summary import union_length

        spans, self._spans = self._spans, []
        comm = union_length([(lo, hi) for lo, hi, _ in spans])
        self.comm_seconds += comm
        self.exposed_seconds += min(comm, union_length([(lo, hi) for lo, hi, mine in spans if mine]))

    @property
    def overlaps(self):
        """True when some bucket can leave while backward still runs: with overlap (or double buffering), and buckets
        ready after different layers. One bucket (or all ready after the same layer) leaves only when backward has
        ended, and nothing of it overlaps."""
        return self.double_buffering or (self.overlap and len(set(self.bucket_ready)) > 1)

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
        for k in range(len(self.buckets)):  # packed from the fresh gradients; the diffs hold the stale mean
            self._launch(k, fresh)
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
        mode = "double buffering" if self.double_buffering else ("overlapped" if self.overlaps else "after backward")
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
