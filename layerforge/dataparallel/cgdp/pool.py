"""The parent process: starts G workers, relays their messages, runs the host accumulation, watches for deaths."""
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time

import numpy

from ... import trace
from ...errors import LayerforgeError, deferring_interrupts, describe_exit
from ...kernels.threadpool import num_threads
from . import shm
from .chunks import WHOLE
from .host import HostAccumulator
from .waits import POLL, Watch
from .workers import WORKER_THREADS_ENV, Shared, worker_main

MPI_ENV_PREFIXES = ("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_", "MPI_LOCAL")


class Result:
    """What a parallel run returns.

    Attributes:
        params: (G, P) final flat parameters of every replica (rows equal when the replicas agree).
        stats: worker 0's :meth:`PhaseTimer.summary` plus ``accumulate`` chunk times from the host and
            ``rates`` (:func:`~layerforge.dataparallel.cgdp.cost_model.measure_rates`, None for a net without parameters)
            and ``latency_s`` (:func:`~layerforge.dataparallel.cgdp.cost_model.measure_latency`).
        iteration_times: host-side wall time of every iteration (host mode), seconds.
        chunk_size: the chunk size in use at the end (host mode).
        iter: the solver's iteration count at the end.
    """

    def __init__(self, params, stats, iteration_times, chunk_size, iter_):
        self.params, self.stats, self.iteration_times = params, stats, iteration_times
        self.chunk_size, self.iter = chunk_size, iter_


class WorkerPool:
    """Runs one parallel job of ``G`` workers with ``options`` (:class:`~layerforge.dataparallel.cgdp.workers.WorkerOptions`).

    Args:
        search: ``(interval, step, range)`` of the chunk-size search (``chunk_size: auto``).
        comm: a Communicator across nodes (MPI, host mode only) or None.
        host_threads: threads summing chunks in the parent.
        signal_effects: ``(sigint_effect, sighup_effect)``: while the workers train, SIGINT / SIGTERM and SIGHUP
            make all of them snapshot or stop after one iteration, as ``layerforge train``'s own handlers do
            (layerforge/solvers/signals.py); None: the parent's usual handling (Ctrl-C ends the job).
    """

    def __init__(self, G, options, search=(10, 1, 3), comm=None, host_threads=2, start_method="spawn",
                 signal_effects=None):
        if G < 1:
            raise LayerforgeError(f"--workers must be >= 1, got {G}")
        if comm is not None and comm.size > 1 and options.sync != "HOST":
            raise LayerforgeError("across nodes only sync: host is supported (tree gathers on one device)")
        self.G, self.options, self.search, self.comm = G, options, search, comm
        self.signal_effects = signal_effects
        self.host_threads, self.ctx = host_threads, multiprocessing.get_context(start_method)
        self.procs, self.conns, self.buffers, self.accumulator = [], [], None, None
        self.shared = Shared(self.ctx, G)
        self.finished = set()
        self.started = threading.Event()  # set once the workers train
        self.watch = None  # the deadline on the workers' waits, once they train (waits.py)

    # -- start-up ---------------------------------------------------------------------------------------------
    def _start(self):
        from ... import emulated_gpu

        launcher = [k for k in os.environ if k.startswith(MPI_ENV_PREFIXES)]
        saved = {k: os.environ.get(k) for k in list(WORKER_THREADS_ENV) + launcher + [emulated_gpu.ENV]}
        if emulated_gpu.installed():  # the emulated device in place of cupy here (installed()): the workers' too
            os.environ[emulated_gpu.ENV] = "1"
        for k in WORKER_THREADS_ENV:  # G processes share the cores: one BLAS pool each would oversubscribe them
            if self.options.split:  # replicas of one process: its threads shared out, whatever it was set to
                os.environ[k] = str(max(1, num_threads() // self.G))
            else:
                os.environ.setdefault(k, str(max(1, (os.cpu_count() or 1) // self.G)))
        for k in launcher:  # under mpiexec: a worker that imports mpi4py must not join the parent's job
            del os.environ[k]
        # a Ctrl-C to the terminal's process group reaches a worker too: it must find the worker ignoring it (the parent
        # decides), not still starting with Python's KeyboardInterrupt, which would print a traceback; the workers
        # start with it held (the mask survives the spawn's exec) and let it in once ignored (worker_main)
        held = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT,))
        try:
            for g in range(self.G):
                # started and recorded for close() at once: a signal raised between the spawn and the write of what
                # the child runs left it an empty pipe to read (EOFError, a traceback) and no one to stop it. The
                # write waits only where that exceeds a pipe's buffer, until the child reads it (its first moments)
                with deferring_interrupts():
                    parent, child = self.ctx.Pipe()
                    p = self.ctx.Process(target=worker_main, args=(g, self.G, self.options, child, self.shared),
                                         name=f"layerforge-worker-{g}", daemon=True)
                    p.start()
                    child.close()
                    self.procs.append(p)
                    self.conns.append(parent)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def request(self, effect):
        """Make every worker carry out ``effect`` (``"snapshot"`` or ``"stop"``, as a training signal asks) after
        the same iteration: two past the furthest any has reported, which none can have reached yet (a
        replica is at most one iteration ahead of the slowest, and an iteration outlasts these writes)."""
        from .workers import EFFECTS

        control = self.shared.control
        target = max(control[2:2 + self.G]) + 2
        control[0] = -1  # no worker may see the new target with the old effect
        control[1] = EFFECTS.index(effect)
        control[0] = target

    def send(self, g, msg):
        try:
            self.conns[g].send(msg)
        except (BrokenPipeError, OSError):
            pass  # the worker is gone; the receive loop reports it

    def _receive(self, want):
        """Wait for one message from every worker in ``want`` (a set of indices); returns ``{g: message}``."""
        got = {}
        while len(got) < len(want):
            for g, msg in self._poll():
                if msg[0] in ("post", "post_all", "params", "ping") and self.handle(g, msg):
                    continue
                got[g] = msg
                if msg[0] == "done":
                    self.finished.add(g)
        return got

    def _poll(self):
        live = [g for g in range(self.G) if g not in self.finished]
        ready = multiprocessing.connection.wait([self.conns[g] for g in live] + [self.procs[g].sentinel for g in live],
                                                timeout=None if self.watch is None else POLL)
        if self.watch is not None:
            self.watch.check()
        out = []
        for g in live:
            conn = self.conns[g]
            if conn in ready:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    self._died(g)
                if msg[0] == "error":  # the user's error as one process says it; a crash names the worker
                    self._fail(msg[1] if msg[2] else f"worker {g} (pid {self.procs[g].pid}) failed: {msg[1]}")
                out.append((g, msg))
        if not out:
            for g in live:
                p = self.procs[g]
                if p.sentinel in ready and not self.conns[g].poll():
                    self._died(g)
        return out

    def _died(self, g):
        p = self.procs[g]
        p.join(1.0)
        self._fail(f"worker {g} (pid {p.pid}) {describe_exit(p.exitcode)}; the job was stopped")

    def _fail(self, message):
        raise LayerforgeError(message)

    # -- messages during training -----------------------------------------------------------------------------
    def handle(self, g, msg):
        kind = msg[0]
        if kind == "post":
            self.accumulator.on_post(g, msg[1])
        elif kind == "post_all":
            self._posted += 1
            if self._posted == self.G - 1:
                self._posted = 0
                self.send(0, ("gathered",))
        elif kind == "params":
            for h in range(1, self.G):
                self.send(h, ("params",))
        elif kind == "ping":
            self.send(g, ("pong",))
        else:
            return False
        return True

    def run(self):
        """Start the workers, train, and return a :class:`Result`; raises LayerforgeError on any failure."""
        try:
            return self._run()
        finally:
            self.close()

    def _run(self):
        self._start()
        hellos = self._receive(set(range(self.G)))
        units, dtype, history_rows = hellos[0][1], numpy.dtype(hellos[0][2]), hellos[0][4]
        for g, msg in hellos.items():
            if msg[1] != units or msg[2] != hellos[0][2]:
                self._fail(f"worker {g} built a different net than worker 0 (parameter layout or dtype differs)")
        total = sum(size for _, _, size in units)
        with deferring_interrupts():  # made and recorded for close() at once: a signal between would leak them
            self.buffers = shm.create(self.G, total, dtype, history_rows)
        for g in range(self.G):
            self.send(g, ("layout", self.buffers.names, total))
        _, start_iter = self._receive({0})[0]
        if self.comm is not None and self.comm.size > 1:  # one starting point for every node
            self.comm.bcast(self.buffers["params"], root=0)
        self._posted = 0
        if self.options.sync == "HOST":
            replicas_combine = hellos[0][5]  # the replicas make the mean in their update: one chunk (as theirs)
            self.accumulator = HostAccumulator(self.buffers["slots"], self.buffers["acc"], units,
                                               WHOLE if replicas_combine else self.options.chunk_size, self.send,
                                               self.search, self.comm, self.host_threads, start_iter,
                                               combine=not replicas_combine)
        for g in range(self.G):
            self.send(g, ("start", start_iter))
        self.watch = Watch(self.shared.waits, self.procs, self.options.solver_param.collective_timeout,
                           "replica" if self.options.split else "worker")
        self.started.set()
        if self.signal_effects is None:
            done = self._receive(set(range(self.G)))
        else:
            from ...solvers.signals import signal_handlers

            with signal_handlers(_Requests(self), *self.signal_effects):
                done = self._receive(set(range(self.G)))
        for g in range(self.G):
            trace.absorb(done[g][3])  # the workers' spans go into this host's trace file
        params = numpy.array(self.buffers["slots"])  # the final parameters, before worker 0's timings reuse the slots
        for p in self.procs[1:]:
            p.join(5.0)
        self.finished.discard(0)
        self.send(0, ("calibrate",))
        _, rates, latency = self._receive({0})[0]
        stats = dict(done[0][1], units=units, G=self.G, sync=self.options.sync, rates=rates, latency_s=latency)
        acc = self.accumulator
        if acc is not None:
            stats["chunks_ms"].update({f"accumulate:{name}": 1000.0 * s / n
                                       for name, (s, n) in acc.accumulate_times.items() if n})
        self.procs[0].join(5.0)  # the others were joined before the timings
        return Result(params, stats, list(acc.iteration_times) if acc else [],
                      acc.chunk_size if acc else None, done[0][2])

    def close(self):
        try:
            for p in self.procs:
                if p.is_alive():
                    p.kill()
            for p in self.procs:
                p.join(5.0)
            for c in self.conns:
                c.close()
            if self.accumulator is not None:
                self.accumulator.close()
        finally:  # whatever the steps above raised (a signal that came as the run ended): the names outlive us else
            if self.buffers is not None:
                self.buffers.close()
                self.buffers = None


class _Requests(list):
    """The ``pending`` list of :func:`~layerforge.solvers.signals.signal_handlers` for a pool: each request goes to
    the workers (:meth:`WorkerPool.request`) at once, so none stays pending but a Ctrl-C's: a second SIGINT then
    still interrupts at once."""

    def __init__(self, pool):
        super().__init__()
        self.pool = pool

    def append(self, request):
        if request[0] == signal.SIGINT:
            super().append(request)
        self.pool.request(request[1])


def run_parallel(G, options, **kwargs):
    """Run a parallel job (see :class:`WorkerPool`); returns its :class:`Result`."""
    t0 = time.perf_counter()
    result = WorkerPool(G, options, **kwargs).run()
    result.wall_s = time.perf_counter() - t0
    return result
