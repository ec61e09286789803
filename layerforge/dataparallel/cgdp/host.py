"""CGDP's host mode: chunk gradients go to shared host memory during backward, host threads combine them.

Worker side (:class:`HostSync`): backward runs layer by layer; as soon as the last layer of a chunk has
run, the chunk is posted to the parent while the main thread goes on with the next layers. On a GPU a copy
thread first moves the chunk's diffs into this worker's slot ``slots[g]`` (a second stream, pinned memory);
a CPU replica's diffs *are* its slot (:meth:`~layerforge.dataparallel.cgdp.transfer.Mover.attach_diffs`), so there
is nothing to copy. When the parent publishes the chunk, the slot holds the mean gradient: a GPU worker
copies it back into its diffs, a CPU worker already has it. Before the update (the solver's seam,
layerforge/solvers/seam.py) the worker waits only for the chunks still in flight; then every worker runs the
same update on the same mean gradient (no parameter server). CPU replicas go further (:func:`share_state`):
their parameters and update history are one copy in shared memory, and each replica updates only its share of
the parameters (:class:`SharedUpdate`).

Parent side (:class:`HostAccumulator`): when all G workers have posted chunk c, a host thread writes the
mean of the G slots into every slot, block by block so that each value is read and written once
(:func:`mean_into_slots`), and publishes the chunk. The replicas of one split batch (cpu_parallel's REPLICAS),
which share one copy of the parameters, need the mean only where they update (their share); unless the update
needs every value of it (gradient clipping takes its global norm; ``iter_size`` > 1 scales whole slots) or the
nodes combine theirs, they make it themselves (:func:`combines_in_update`): each replica adds up the slots' rows
of its share a block at a time inside its update (:meth:`SharedUpdate.combine_gradient`), while the update has
the block in the cache. That reads the G slots once and writes nothing more (the host's mean wrote all G slots,
and the update read the mean back), and no host thread competes with the replicas for the cores. Nor do the
messages: with nothing for the host to do during backward, such replicas post their gradients as one chunk
(chunks.WHOLE) when backward ends, and the host publishes it once every replica has (a chunk a layer woke the
host and each replica's message thread some hundred times an iteration, on the cores the replicas compute on:
20-28 ms of a ResNet-50 replica's backward went to posting them, docs/performance.md). With MPI across nodes
the host thread sums the slots into ``acc``, chunks pass through the communicator's mean in chunk order (local
aggregation first), and the node-wide mean is then written into the slots.
"""
import concurrent.futures
import os
import queue
import threading
import time

import numpy

from ... import trace
from ...solvers.seam import Seam
from . import waits
from .chunks import ChunkSearch, make_chunks, param_units, units_from_sizes

BLOCK_BYTES = 1 << 19  # the G slots' part of one block and the sum stay in a core's cache between passes


def _param_offsets(net, units):
    offsets = [None] * len(net.learnable_params)
    for u in units:
        off = u.offset
        for k in u.params:
            n = int(net.learnable_params[k].count)
            offsets[k] = (off, n)
            off += n
    return offsets


def combines_in_update(solver, nodes):
    """Whether CPU replicas of one shared copy (the solver of one of them) on ``nodes`` nodes make the mean of
    their gradients in their update (see the module docstring) instead of the host's threads."""
    return nodes == 1 and solver.param.clip_gradients < 0 and solver.param.iter_size == 1


def share_state(solver, mover, params, history, g, G, barrier, timer, slots=None, offsets=None):
    """Make CPU replica ``g`` of ``G`` train on one shared copy of the parameters and of the update history;
    returns its :class:`SharedUpdate`, the seam to give the solver; with ``slots`` (the replicas' (G, P)
    gradient slots) and ``offsets`` (each learnable parameter's ``(offset, count)`` in a slot), the replica makes
    the mean gradient of its share in its update (:func:`combines_in_update`).

    The parameters' data become views of ``params``, into which worker 0 first copies its own (the replicas'
    starting point), and the history arrays views of the rows of ``history`` (zeros, as a fresh history is; a
    resumed run restores into them); the test nets read the shared data too. Blobs that forward writes
    (BatchNorm's running statistics, which every replica updates alike) stay each replica's.
    """
    net = solver.net
    if g == 0:
        mover.params_to_host(params)
    # what a layer's forward writes, not the update (BatchNorm's running statistics), stays each replica's own
    written = {id(b) for layer in net.layers if not layer.learnable for b in layer.blobs}
    mover.attach_params(params, keep={k for k, b in enumerate(net.learnable_params) if id(b) in written})
    solver.adopt_history(mover.history_views(solver.history, history))
    for test_net in solver.test_nets:
        test_net.share_params_with(net)
    combine = None if slots is None else (slots, g, offsets)
    return SharedUpdate(update_shares(net.learnable_params, G)[g], barrier, timer, combine)


class SharedUpdate(Seam):
    """CPU replicas of one shared copy of the parameters: each updates only its ``share`` of them
    (:func:`update_shares`: the update's time and memory traffic split over the replicas instead of repeated by
    each), with the mean gradient every slot holds, so every parameter gets exactly one process's update. After its
    update each replica waits at ``barrier`` for the others: no replica reads a parameter of the next iteration (or
    snapshots) while another still writes it, nor clears its slot while another still reads it. Before the update
    nobody writes: every chunk has been posted (and, by the host, combined), so every replica has finished the
    backward passes that read the parameters.

    ``combine``: ``(slots, g, offsets)`` where this replica makes the mean itself: before each block of its share is
    updated, the block of its slot ``slots[g]`` (its diffs) becomes the mean of the G slots' blocks
    (:func:`mean_of_rows`: the same sums in the same order as the host's, so the same bits)."""

    def __init__(self, share, barrier, timer, combine=None):
        self.share, self.barrier, self.timer, self.combine = share, barrier, timer, combine

    def update_share(self):
        return self.share

    def combine_gradient(self, i, part):
        if self.combine is None:
            return
        slots, g, offsets = self.combine
        off, n = offsets[i]
        start, stop = part or (0, n)
        rows = slots[:, off + start:off + stop]
        mean_of_rows(rows, rows[g])

    def end_iteration(self, iteration, loss):
        t0 = time.perf_counter()
        with waits.waiting():
            self.barrier.wait()
        self.timer.add("exchange", time.perf_counter() - t0)


def update_shares(params, G):
    """``[{parameter index: rows}]`` for G replicas: the parameters' rows (first axis) in order, cut into G runs of
    about equal size (``rows`` a slice, or None for the whole parameter), so that one large parameter does not make
    one replica's share large. Every row is in exactly one share; a share may be empty."""
    total = sum(int(p.count) for p in params)
    shares, start = [{} for _ in range(G)], 0
    for k, p in enumerate(params):
        rows = int(p.shape[0]) if len(p.shape) else 1
        per_row = int(p.count) // rows if rows else 0
        owner = numpy.minimum(G - 1, (start + per_row * numpy.arange(rows)) * G // max(1, total))
        for r in numpy.unique(owner):
            hit = numpy.flatnonzero(owner == r)
            shares[int(r)][k] = None if len(hit) == rows else slice(int(hit[0]), int(hit[-1]) + 1)
        start += int(p.count)
    return shares


class HostSync(Seam):
    """Worker side of host mode (see the module docstring): during the last of the solver's ``iter_size`` passes
    a chunk leaves as soon as backward has finished its last layer (:meth:`layer_gradients_ready`, after each
    layer's step of backward; earlier passes accumulate locally), and before the update the worker waits for the
    ones still in flight. The sending passes' backward time per layer goes to the timer's ``layer_backward``."""

    layer_hooks = True

    def __init__(self, solver, link, slot, chunk_size, mover, timer):
        if solver.param.cuda_graph:  # a replayed backward would post no chunk, and every worker would wait for them
            raise solver.param.error("cuda_graph cannot record sync host's backward (each chunk leaves from inside it, "
                                     "layer by layer): use sync tree, or cuda_graph: false", "cuda_graph")
        self.solver, self.link, self.slot, self.mover, self.timer = solver, link, slot, mover, timer
        self.units = param_units(solver.net)
        self.size = 1 if chunk_size == "auto" else chunk_size  # auto starts the search at 1, as the host does
        self.chunks = make_chunks(self.units, self.size)
        self.by_layer = {c.last_layer: c for c in self.chunks}
        self.copies = not mover.attach_diffs(slot)
        self.iter_size, self.armed, self._layer_start = solver.param.iter_size, False, 0.0
        solver.net.add_hooks(before_backward=self._before_layer)
        self.cond = threading.Condition()
        self.received, self.next_size = 0, None
        if self.copies:
            self.outbox = queue.SimpleQueue()
            threading.Thread(target=self._copy_out, name="cgdp-copy-out", daemon=True).start()
        link.handlers["ready"] = self._ready

    def before_pass(self, k):
        """Arm the chunks' sends for the last of the iter_size passes."""
        self.armed = k == self.iter_size - 1

    def _before_layer(self, i):
        if self.armed:
            self._layer_start = time.perf_counter()

    def layer_gradients_ready(self, i):
        """After layer ``i``'s step of backward: post the chunk it completes (when armed)."""
        if not self.armed:
            return
        times = self.timer.layer_backward
        times[i] = times.get(i, 0.0) + time.perf_counter() - self._layer_start
        c = self.by_layer.get(i)
        if c is not None:
            self._post(c, self.mover.mark())

    def _post(self, chunk, token):
        if self.copies:
            self.outbox.put((chunk, token))
        else:  # the diffs are the slot: the chunk is already in shared memory
            self.link.send(("post", chunk.index))

    def _copy_out(self):
        try:
            while True:
                chunk, token = self.outbox.get()
                t0 = time.perf_counter()
                with trace.span("host", f"copy-out {chunk.name}", bytes=chunk.size * self.slot.itemsize):
                    self.mover.to_host(chunk.params, self.slot, token)
                self.timer.add_chunk("copy_out", chunk.name, time.perf_counter() - t0)
                self.link.send(("post", chunk.index))
        except BaseException as e:  # noqa: BLE001 - the other workers wait for this chunk: end the job
            self.link.send(("error", f"copy-out thread: {type(e).__name__}: {e}", False))
            os._exit(1)

    def _ready(self, msg):
        _, c, next_size = msg
        if self.copies:
            chunk = self.chunks[c]
            t0 = time.perf_counter()
            with trace.span("host", f"copy-back {chunk.name}", bytes=chunk.size * self.slot.itemsize):
                self.mover.to_device(chunk.params, self.slot)
            self.timer.add_chunk("copy_back", chunk.name, time.perf_counter() - t0)
        with self.cond:
            self.received += 1
            if next_size is not None:
                self.next_size = next_size
            self.cond.notify_all()

    def before_update(self):
        """Wait for the chunks still in flight, then switch layout if the search asked."""
        t0 = time.perf_counter()
        with trace.wait("comm", what="chunks"), waits.waiting(), self.cond:
            while self.received < len(self.chunks):
                self.link.check()
                self.cond.wait(0.5)
            self.received = 0
        self.mover.synchronize()
        self.armed = False
        self.timer.add("exchange", time.perf_counter() - t0)
        if self.next_size is not None and self.next_size != self.size:
            self.size = self.next_size
            self.chunks = make_chunks(self.units, self.size)
            self.by_layer = {c.last_layer: c for c in self.chunks}
        self.timer.chunk_size = self.size
        return True


class HostAccumulator:
    """Parent side of host mode: combines the G posted copies of each chunk and publishes the chunk.

    Args:
        slots: (G, P) shared array of the workers' partial gradients; acc: (P,) shared accumulated gradient.
        unit_sizes: the units' ``(layer, name, size)`` in backward order (from worker 0).
        chunk_size: an int, ``"auto"`` or chunks.WHOLE; search: ``(interval, step, range)`` for auto.
        send: ``send(g, message)`` to worker g. comm: a Communicator across nodes, or None.
        threads: host threads that accumulate chunks concurrently.
        combine: False where the replicas make the mean themselves (:func:`combines_in_update`): a chunk is
            published as soon as every worker has posted it.
        first_iter: the workers' first iteration (the host's trace marks each iteration when the previous ends).
    """

    def __init__(self, slots, acc, unit_sizes, chunk_size, send, search=(10, 1, 3), comm=None, threads=2,
                 first_iter=0, combine=True):
        self.slots, self.acc, self.send, self.comm, self.combine = slots, acc, send, comm, combine
        self.G = slots.shape[0]
        self.units = units_from_sizes(unit_sizes)
        self.search = None
        if chunk_size == "auto":
            interval, step, rng = search
            self.search = ChunkSearch(max(1, len(self.units)), interval, step, rng)
            chunk_size = self.search.size
        self.chunk_size = chunk_size
        self.chunks = make_chunks(self.units, chunk_size)
        self.counts = [0] * len(self.chunks)
        self.published = 0
        self.lock = threading.Lock()
        self.pool = concurrent.futures.ThreadPoolExecutor(max(1, threads), thread_name_prefix="cgdp-acc",
                                                          initializer=trace.name_thread, initargs=("host accumulate",))
        self.accumulate_times = {}  # chunk name -> [seconds, count]
        self.network = queue.SimpleQueue() if comm is not None else None
        self.last_end = None
        self.iteration_times = []
        self.iter = first_iter
        trace.iteration(first_iter)
        if comm is not None:
            threading.Thread(target=self._network_loop, name="cgdp-network", daemon=True).start()

    def on_post(self, g, c):
        """Worker ``g`` has put chunk ``c`` into its slot."""
        with self.lock:
            self.counts[c] += 1
            full = self.counts[c] == self.G
            if full:
                self.counts[c] = 0
        if full and not self.combine:
            self._publish(c)
        elif full:
            self.pool.submit(self._combine, c).add_done_callback(_reraise)

    def _combine(self, c):
        chunk = self.chunks[c]
        seg = slice(chunk.offset, chunk.offset + chunk.size)
        t0 = time.perf_counter()
        with trace.span("host", f"accumulate {chunk.name}", bytes=chunk.size * self.slots.itemsize, workers=self.G):
            if self.network is None:
                mean_into_slots(self.slots[:, seg])
            else:
                sum_slots(self.acc[seg], self.slots[:, seg])
        with self.lock:
            rec = self.accumulate_times.setdefault(chunk.name, [0.0, 0])
            rec[0] += time.perf_counter() - t0
            rec[1] += 1
        if self.network is None:
            self._publish(c)
        else:
            self.network.put(c)

    def _network_loop(self):
        # every rank must call the collectives in the same order: chunks are reduced in index order
        done, ready = 0, set()
        while True:
            ready.add(self.network.get())
            while done in ready:
                ready.discard(done)
                chunk = self.chunks[done]
                seg = slice(chunk.offset, chunk.offset + chunk.size)
                if chunk.size:
                    with trace.span("comm", f"chunk {chunk.name}", bytes=chunk.size * self.acc.itemsize):
                        self.comm.mean(self.acc[seg])  # the mean over nodes of the node sums
                    for row in self.slots[:, seg]:
                        numpy.multiply(self.acc[seg], row.dtype.type(1.0 / self.G), out=row)
                is_last = done == len(self.chunks) - 1
                self._publish(done)
                done = 0 if is_last else done + 1

    def _publish(self, c):
        with self.lock:
            self.published += 1
            last = self.published == len(self.chunks)
            next_size = None
            if last:
                self.published = 0
                next_size = self._iteration_done()
        for g in range(self.G):
            self.send(g, ("ready", c, next_size))

    def _iteration_done(self):
        now = time.perf_counter()
        self.iter += 1
        trace.iteration(self.iter)  # what the host does next belongs to the workers' next iteration
        seconds = None if self.last_end is None else now - self.last_end
        self.last_end = now
        if seconds is not None:
            self.iteration_times.append(seconds)
        if self.search is None or seconds is None or self.search.done:
            return None
        if self.comm is not None:  # all nodes must choose the same layout
            t = numpy.array([seconds])
            self.comm.allreduce(t)
            seconds = float(t[0]) / self.comm.size
        size = self.search.record(seconds)
        if size == self.chunk_size:
            return None
        self.chunk_size = size
        self.chunks = make_chunks(self.units, size)
        self.counts = [0] * len(self.chunks)
        return size

    def close(self):
        self.pool.shutdown(wait=False, cancel_futures=True)


def sum_slots(out, slots):
    """``out = slots[0] + ... + slots[G-1]``, reading every slot once and writing ``out`` once."""
    if len(slots) == 1:
        numpy.copyto(out, slots[0])
        return
    numpy.add(slots[0], slots[1], out=out)
    for row in slots[2:]:
        out += row


def mean_into_slots(slots):
    """Write the mean of the rows of ``slots`` (G x n) into every row.

    Block by block, so that each value is read from memory once and written once (2G values of traffic
    per value of the chunk) instead of a pass per operation.
    """
    G, n = slots.shape
    if G == 1 or n == 0:
        return
    step = max(4096, BLOCK_BYTES // ((G + 1) * slots.dtype.itemsize))
    block = numpy.empty(min(n, step), slots.dtype)
    for start in range(0, n, step):
        part = slots[:, start:start + step]
        out = block[:part.shape[1]]
        mean_of_rows(part, out)
        for row in part:
            numpy.copyto(row, out)


def mean_of_rows(rows, out):
    """``out = (rows[0] + ... + rows[G-1]) * (1 / G)``, element by element, the sums in row order (``out`` may be
    one of the rows: a row after the first two would be overwritten before it is added, so that one goes
    through a scratch array)."""
    if any(numpy.may_share_memory(out, row) for row in rows[2:]):
        scratch = numpy.empty_like(out)
        mean_of_rows(rows, scratch)
        numpy.copyto(out, scratch)
        return
    sum_slots(out, rows)
    out *= rows.dtype.type(1.0 / len(rows))


def _reraise(future):
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:  # a failing host thread must not leave the workers waiting silently
        import _thread
        import sys

        print(f"error: host accumulation thread failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        _thread.interrupt_main()
