"""G worker processes, each with its own solver replica, coordinated by the parent through pipes.

Start-up: every worker builds the solver from the same solver file with its data shard
(``rank = node * G + g``, ``world_size = nodes * G``) and sends ``hello`` (its parameter units); the parent
creates the shared buffers (``slots`` G x P, ``acc`` P, ``params`` P), worker 0 copies its initial
parameters into ``params`` and every other worker copies them in, so all replicas start identical (at the
solver's start, :meth:`Worker.start`). Each worker trains with its seams given to the solver
(layerforge/solvers/seam.py), in this order: the CPU replicas' :class:`~layerforge.dataparallel.cgdp.host.SharedUpdate`
(one copy of the parameters), :class:`~layerforge.dataparallel.cgdp.host.HostSync` or
:class:`~layerforge.dataparallel.cgdp.tree.TreeSync`, the :class:`Worker` (its place among the others: root,
start, signal requests, whole snapshots), a split batch's :class:`MeanOutputs`, and last the
:class:`~layerforge.dataparallel.cgdp.stats.PhaseTimer`. Finally it copies its parameters into its slot so
the parent can check that the replicas agree; worker 0 then times the exchange's operations for the cost
model (:func:`~layerforge.dataparallel.cgdp.cost_model.measure_rates`) while the others are gone.

A worker that dies (a signal, ``os._exit``) or raises ends the job: the parent notices the closed pipe or
the process sentinel, stops the other workers and raises one LayerforgeError. A LayerforgeError of the worker's
(the user's input: a config value, a data record, a non-finite loss, a snapshot path) or running out of memory
reaches the user as the one line a single process prints; a crash (a signal, any other exception) names the
worker.
"""
import os
import queue
import signal
import threading
import time
import traceback

from ... import trace
from ...cores import THREAD_VARS
from ...errors import LayerforgeError, out_of_memory
from ...solvers.seam import Seam
from . import waits

WORKER_THREADS_ENV = THREAD_VARS


class WorkerOptions:
    """What a worker needs besides its index (picklable for 'spawn').

    Args:
        source: the solver: a SolverParameter (read once, by the parent), or a YAML path or dict, read here;
            overrides: solver key overrides (``max_iter=...``). Kept as ``solver_param``.
        sync: ``"HOST"`` or ``"TREE"``; chunk_size: int or ``"auto"``.
        devices: GPU ids per worker (None: CPU); batch: per-worker batch size override (or None).
        node, nodes: this host's index and the number of hosts (MPI ranks) for data sharding.
        iterations: run ``solver.step(iterations)`` instead of ``solve()`` (timing); resume: a solver state.
        log: whether worker 0 logs (glog format, to stdout).
        setup: an importable ``fn(g, solver)`` each worker runs once its solver is built, before it joins the others
            (instrumentation, passes of the net: not solver iterations, which would start training alone).
        split: the net's batch is the whole host's: each of the G workers trains on 1/G of it (``Net(split=...)``,
            mathematically one process with the whole batch) instead of the net's batch per worker; ``batch``
            is then the whole batch too.
        progress: worker 0 shows training progress (layerforge.logs.Progress, a status line every ``progress``
            seconds when stderr is not a terminal); None: not.
        trace: the iteration window (text, as ``--trace-iterations``) each worker records and hands to the parent
            with its "done" (docs/trace.md); None: no trace.
        tensorboard: worker 0 writes TensorBoard scalars of the whole job to this folder; None: not.
        share_activations: the worker's nets share their activations' storage (``Solver.share_activations``).
    """

    def __init__(self, source, overrides=None, sync="HOST", chunk_size=1, devices=None, batch=None,
                 node=0, nodes=1, iterations=None, resume=None, log=True, setup=None, split=False, progress=None,
                 trace=None, tensorboard=None, share_activations=False):
        from ...solvers import SOLVER_REGISTRY, load_solver_param

        self.solver_param = load_solver_param(source, SOLVER_REGISTRY, **dict(overrides or {}))
        self.sync, self.chunk_size = sync, chunk_size
        self.devices, self.batch, self.node, self.nodes = devices, batch, node, nodes
        self.iterations, self.resume, self.log, self.setup = iterations, resume, log, setup
        self.split, self.progress = split, progress
        self.trace, self.tensorboard, self.share_activations = trace, tensorboard, share_activations


class Link:
    """A worker's end of its pipe: a receiver thread runs handlers; other messages queue for the main thread."""

    def __init__(self, conn):
        self.conn, self.lock = conn, threading.Lock()
        self.handlers, self.mailbox = {}, queue.SimpleQueue()
        self.error = None
        threading.Thread(target=self._receive, name="cgdp-inbox", daemon=True).start()

    def send(self, msg):
        with self.lock:
            self.conn.send(msg)

    def _receive(self):
        try:
            while True:
                msg = self.conn.recv()
                handler = self.handlers.get(msg[0])
                if handler is not None:
                    handler(msg)
                else:
                    self.mailbox.put(msg)
        except (EOFError, OSError):
            os._exit(3)  # the parent is gone: nobody will ever answer
        except BaseException as e:  # noqa: BLE001 - a failing copy-back must end the job, not hang it
            self.error = f"{type(e).__name__}: {e}"
            self.mailbox.put(("failed",))

    def check(self):
        if self.error is not None:
            raise LayerforgeError(self.error)

    def expect(self, kind):
        with waits.waiting():
            msg = self.mailbox.get()
        self.check()
        if msg[0] != kind:
            raise LayerforgeError(f"protocol error: expected '{kind}', got '{msg[0]}'")
        return msg


class Shared:
    """What the G workers share besides the gradient buffers, made by the parent before they start (picklable
    only then): ``barrier`` (host mode's CPU replicas wait there after their share of the update), ``control``
    (``[iteration to act after, effect code, each worker's iteration]``: signal requests, :meth:`Worker.agree`),
    ``outputs`` (replicas of one batch: their train outputs, :class:`MeanOutputs`), ``statistics`` (their
    BatchNorm sums, layerforge/dataparallel/cgdp/replica_sum.py) and ``waits`` (waits.py)."""

    def __init__(self, ctx, G):
        from .replica_sum import table_size

        self.barrier = ctx.Barrier(G)
        self.control = ctx.Array("q", 2 + G, lock=False)
        self.control[0] = -1
        self.outputs = ctx.Array("d", G * (2 + OUTPUT_VALUES), lock=False)
        self.statistics = ctx.Array("d", table_size(G), lock=False)
        self.waits = ctx.Array("d", G, lock=False)  # since when each worker waits for the others (waits.py)


def worker_main(g, G, options, conn, shared):
    """Entry point of worker ``g`` of ``G`` (runs in a spawned process); ``shared``: a :class:`Shared`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the workers
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT,))  # held since the spawn (WorkerPool._start)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # and a hang-up (a worker whose parent is gone exits)
    link = Link(conn)
    waits.install(shared.waits, g)
    try:
        _run_worker(g, G, options, link, shared)
    except LayerforgeError as e:  # the user's: the parent says it as one process would (user=True)
        link.send(("error", str(e), True))
        os._exit(1)
    except MemoryError as e:
        link.send(("error", out_of_memory(e), True))
        os._exit(1)
    except BaseException as e:  # noqa: BLE001
        where, text = traceback.extract_tb(e.__traceback__)[-1], " ".join(str(e).split())  # one line
        link.send(("error", f"{type(e).__name__}: {text} ({os.path.basename(where.filename)}:{where.lineno})", False))
        os._exit(1)
    os._exit(0)


def _run_worker(g, G, options, link, shared):
    import logging

    from ...logs import setup_logging
    from .chunks import WHOLE, param_units, unit_sizes
    from .host import HostSync, _param_offsets, combines_in_update, share_state
    from .replica_sum import ReplicaSum, share_batch_statistics
    from .shm import attach
    from .stats import PhaseTimer
    from .transfer import make_mover
    from .tree import TreeSync

    if options.log and g == 0:
        setup_logging()
    else:
        logging.getLogger("layerforge").setLevel(logging.WARNING)
    device = {} if options.devices is None else dict(solver_mode="GPU", device_id=int(options.devices[g]))
    rank, world = options.node * G + g, options.nodes * G
    split = (g, G) if options.split else None
    solver = build_solver(options.solver_param, device, options.batch, shard=(rank, world), split=split)
    if options.share_activations:
        solver.share_activations()
    solver.check_memory(G)  # the G replicas of this host together, as one process checks its own
    if options.setup is not None:
        options.setup(g, solver)
    if options.split:  # after the setup, whose passes (a warm-up) the replicas need not make alike
        share_batch_statistics(solver.net, ReplicaSum(shared.statistics, g, G, link.check))
    net = solver.net
    units = param_units(net)
    # CPU replicas of host mode share one copy of the parameters and of the update history, each updating its
    # share; the replicas of one split batch (cpu_parallel) make the mean gradient of their share where they can
    # (the host then only counts the posts; CGDP's CPU workers keep the host's mean that its cost model times)
    one_copy = options.sync == "HOST" and net.xp.__name__ == "numpy"  # host memory: replicas on the CPU
    combine = one_copy and options.split and combines_in_update(solver, options.nodes)
    link.send(("hello", unit_sizes(units), net.dtype.str, os.getpid(), solver.history_per_param, combine))
    _, names, total = link.expect("layout")
    buffers = attach(names, G, total, net.dtype, solver.history_per_param)
    slots, acc, params = buffers["slots"], buffers["acc"], buffers["params"]
    offsets = _param_offsets(net, units)
    mover = make_mover(net, offsets, (slots[g], acc, params))
    timer = PhaseTimer()
    if one_copy:  # attached at once, so that their own copies (and diffs) are let go before the others are made
        solver.add_seam(share_state(solver, mover, params, buffers["history"], g, G, shared.barrier, timer,
                                    *((slots, offsets) if combine else ())))
    if options.sync == "HOST":  # (one chunk where the replicas make the mean: the host has nothing to overlap)
        solver.add_seam(HostSync(solver, link, slots[g], WHOLE if combine else options.chunk_size, mover, timer))
    else:
        solver.add_seam(TreeSync(solver, link, g, slots, params, mover, timer))
    solver.add_seam(Worker(solver, g, rank, link, shared, mover, params, one_copy))
    if options.resume:  # every replica (one copy: each writes the same values into the one copy)
        solver.restore(options.resume)
    if options.split:
        solver.add_seam(MeanOutputs(solver, g, G, shared.outputs, link))
    solver.add_seam(timer.install(solver))  # last: it times the update between the other seams' waits
    close_progress = solver.show_progress(options.progress) if options.progress is not None and g == 0 else None
    scalars = record(solver, g, G, options)
    try:
        if options.iterations is not None:
            solver.step(options.iterations)
        else:
            solver.solve(sigint_effect="none", sighup_effect="none")
    finally:  # ends the bar's line before the parent's error line, as train's own bar does
        if close_progress is not None:
            close_progress()
        if scalars is not None:
            scalars.close()
    mover.params_to_host(slots[g])  # the parent compares the replicas
    link.send(("done", dict(timer.summary(), images_per_iteration=solver.images_per_iteration()), solver.iter,
               trace.stop()))
    if g == 0:  # once the others are gone, time the exchange's operations for the cost model
        link.expect("calibrate")
        from .cost_model import measure_latency, measure_rates

        rates = measure_rates(net.learnable_params, mover, slots, acc, solver.xp)
        link.send(("rates", rates, measure_latency(link)))
    mover.close()
    buffers.close()


class Worker(Seam):
    """Worker ``g`` (``rank`` of the job) among the others of its host, as a seam of its solver.

    - Root: rank 0 displays, logs the tests and writes the snapshots.
    - :meth:`start`: every replica starts from worker 0's parameters and iteration (worker 0 copies its parameters
      into the shared ``params``, after any restore, and says its iteration; the parent answers every worker with
      the iteration to start at, and the others copy the parameters in; one shared copy needs no copying).
    - :meth:`end_iteration`: the worker publishes its iteration in ``control[2 + g]``; :meth:`agree` carries out the
      request the parent writes into ``control[:2]`` (the iteration to act after, the effect's code) at exactly that
      iteration, as every other worker does (:meth:`~layerforge.dataparallel.cgdp.pool.WorkerPool.request`).
    - :meth:`after_snapshot`: every worker takes the snapshots after the same iterations and goes on only once
      worker 0 has written it whole, as one process does: the snapshot a later error names is on disk.
    """

    def __init__(self, solver, g, rank, link, shared, mover, params, one_copy):
        self.solver, self.g, self.link, self.mover, self.params = solver, g, link, mover, params
        self.control, self.barrier, self.one_copy = shared.control, shared.barrier, one_copy
        self.root = rank == 0

    def start(self, iteration):
        if self.g == 0:
            if not self.one_copy:
                self.mover.params_to_host(self.params)
            self.link.send(("initial", iteration))
        _, start_iter = self.link.expect("start")
        if self.g != 0 and not self.one_copy:
            self.mover.params_from_host(self.params)
        return iteration if self.g == 0 else start_iter

    def end_iteration(self, iteration, loss):
        self.control[2 + self.g] = self.solver.iter

    def agree(self, action):
        return EFFECTS[self.control[1]] if self.control[0] == self.solver.iter else "none"

    def after_snapshot(self):
        with waits.waiting():
            self.barrier.wait()


def record(solver, g, G, options):
    """Start worker ``g``'s trace (its part goes to the parent with "done") and, on worker 0, the job's TensorBoard
    scalars, as ``options`` ask; returns the ScalarWriter or None."""
    if options.trace is not None:
        where = f"node {options.node} " if options.nodes > 1 else ""
        trace.start(None, trace.parse_window(options.trace), pid=options.node * G + g,
                    process_name=f"{where}worker {g}", xp=solver.xp)
    if options.tensorboard is None or g != 0 or options.node != 0:
        return None
    images = solver.images_per_iteration()  # a split batch is the host's whole batch
    workers = options.nodes * (1 if options.split else G)
    return solver.write_scalars(options.tensorboard, images and images * workers)


def build_solver(solver_param, overrides, batch=None, shard=None, split=None):
    """``get_solver(solver_param, shard, split, **overrides)`` (``solver_param``: a SolverParameter, or a path or dict
    to read), its net given batch ``batch`` when not None (``layerforge time --batch``: the same solver over the net
    with another batch size)."""
    import copy

    from ...net.netdef import load_net_def, set_batch_size
    from ...solvers import SOLVER_REGISTRY, get_solver
    from ...solvers.param import load_solver_param

    if batch is None:
        return get_solver(solver_param, shard=shard, split=split, **overrides)
    sp = copy.copy(load_solver_param(solver_param, SOLVER_REGISTRY, **overrides))  # its net changes: not the caller's
    sp.net_param = set_batch_size(load_net_def(sp.train_net_source()), batch)
    sp.net = sp.train_net = sp.train_net_param = None
    return SOLVER_REGISTRY[sp.type](sp, shard=shard, split=split)


EFFECTS = ("none", "snapshot", "stop")  # the codes of control[1]
OUTPUT_VALUES = 256  # train output values (losses, accuracies) replicas of one batch average for the display


class MeanOutputs(Seam):
    """Replica ``g`` of one batch publishes its loss and train outputs in its row of ``outputs`` (G rows of
    ``[iteration + 1, loss, values...]``) every iteration, and worker 0 displays, smooths and snapshots the mean of
    the G rows: the whole batch's, since every replica's loss is normalised by its equal share of the batch.
    Worker 0 waits for the others' forward passes only; nobody overwrites a row before worker 0 has read it
    (the next forward comes after the update, which waits for worker 0's chunks). Train outputs of more than
    :data:`OUTPUT_VALUES` values are not averaged (worker 0 shows its own, with a warning)."""

    shares_loss = True

    def __init__(self, solver, g, G, outputs, link):
        import logging

        import numpy

        self.solver, self.g, self.link = solver, g, link
        net = solver.net
        self.blobs = [net.blobs[name] for name in net.outputs]
        self.count = sum(int(b.count) for b in self.blobs)
        if self.count > OUTPUT_VALUES:
            logging.getLogger("layerforge").warning("the train outputs hold %d values, more than the %d replicas "
                                                    "average: worker 0 shows its own", self.count, OUTPUT_VALUES)
            self.shares_loss = False
            return
        self.table = numpy.frombuffer(outputs, dtype=numpy.float64).reshape(G, 2 + OUTPUT_VALUES)

    def reduce_loss(self, loss):
        import numpy

        if not self.shares_loss:
            return loss
        table, count, iteration = self.table, self.count, self.solver.iter
        row = table[self.g]
        row[1] = loss
        if count:
            row[2:2 + count] = numpy.concatenate([numpy.asarray(b.data, numpy.float64).reshape(-1) for b in self.blobs])
        row[0] = iteration + 1  # written last: the row is complete
        if self.g != 0:
            return loss
        with trace.wait("comm", what="train outputs"), waits.waiting():  # the other replicas' forward passes
            while (table[:, 0] < iteration + 1).any():
                self.link.check()
                time.sleep(0.0002)
        mean = table[:, 1:2 + count].mean(axis=0)
        offset = 1
        for b in self.blobs:
            b.data[...] = mean[offset:offset + b.count].reshape(b.shape)
            offset += b.count
        return float(mean[0])
