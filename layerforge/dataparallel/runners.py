"""One entrance to training: the five ways ``layerforge train`` runs a solver, and the one choice between them.

commands/train.py reads the solver file once, with the command line's overrides (``--gpu``, ``--max-iter``,
``--sync`` ...), inside :func:`process_guard`; :func:`runner_for` picks the runner, the first that applies of:

============  ==========================================================================================
``restarts``  ``--ranks P`` / ``--max-restarts N`` (or the solver's ``max_restarts``), not under mpiexec: this
              process starts the job (mpiexec, or one process) and again after a lost rank (restarts.py)
``workers``   ``--workers N`` / ``--devices LIST``: CGDP's workers of this host (cgdp/); under mpiexec each rank
              is one host
``ranks``     under mpiexec: one replica per rank, gradients exchanged between them (gradient_exchange.py)
``replicas``  a CPU run whose ``cpu_parallel`` is, or AUTO chooses, REPLICAS: single-threaded replicas of one
              split batch (cpu_parallel.py)
``one``       one process
============  ==========================================================================================

Each runner is ``runner(sp, run, rank) -> exit status``: ``sp`` the SolverParameter as read (overrides applied),
``run`` a :class:`TrainRun` (what else the command line asks), ``rank`` a :class:`Rank` under mpiexec, else None.
The processes a runner starts as its children (CGDP workers, CPU replicas) are handed ``sp`` itself (pickled in
WorkerOptions) and never read the file; those that are a ``layerforge train`` of their own (the ranks mpiexec
starts, each start of a restarted job) read it once each, at their own entrance, as this process did.
"""
import contextlib
import functools
import logging

from ..cores import mpi_world_size
from ..logs import setup_logging
from . import restarts
from .supervisor import release_held_signals

log = logging.getLogger("layerforge")


class TrainRun:
    """What ``layerforge train`` asks of a run besides the solver (its arguments, read by commands/train.py).

    Attributes:
        snapshot, weights: the solver state to resume, or the weights to start from (``weights`` is in the
            SolverParameter too; the restarts pass both on); argv: train's command line, for a restarted job.
        ranks, hostfile, mpiexec, max_restarts, min_ranks: the restarts' options (restarts.py).
        workers, devices: CGDP's workers or GPUs (``sync`` and ``chunk_size`` are in the SolverParameter).
        cpu_parallel: ``--cpu-parallel``, or None (the solver's ``cpu_parallel``).
        sigint_effect, sighup_effect: what Ctrl-C / SIGTERM and SIGHUP do.
        progress: seconds between status lines of the progress display, or None for none.
        trace, trace_iterations, tensorboard: the telemetry asked for (None: the solver's keys).
        reuse: the nets' activations share storage (``Solver.share_activations``; ``--no-reuse``: False).
        report: ``report(stats, replicas)`` prints a job of workers' phases (replicas: a split batch's, to the log).
    """

    def __init__(self, snapshot=None, weights=None, argv=None, ranks=None, hostfile=None, mpiexec=None,
                 max_restarts=None, min_ranks=None, workers=None, devices=None, cpu_parallel=None,
                 sigint_effect="stop", sighup_effect="snapshot", progress=None, trace=None, trace_iterations=None,
                 tensorboard=None, report=None, reuse=True):
        self.snapshot, self.weights, self.argv = snapshot, weights, argv
        self.ranks, self.hostfile, self.mpiexec = ranks, hostfile, mpiexec
        self.max_restarts, self.min_ranks = max_restarts, min_ranks
        self.workers, self.devices, self.cpu_parallel = workers, devices, cpu_parallel
        self.sigint_effect, self.sighup_effect, self.progress = sigint_effect, sighup_effect, progress
        self.trace, self.trace_iterations, self.tensorboard = trace, trace_iterations, tensorboard
        self.report = report or (lambda stats, replicas: None)
        self.reuse = reuse

    @property
    def parallel(self):
        """Workers or devices of this host (CGDP)."""
        return bool(self.workers or self.devices)


class Rank:
    """This process as a rank under mpiexec: ``comm`` (MPI's COMM_WORLD) and ``requests``, what signals asked
    before the training loop's own handlers were in place (one replica per rank only)."""

    def __init__(self, comm, requests):
        self.comm, self.requests = comm, requests


@contextlib.contextmanager
def process_guard(run):
    """Where ``layerforge train`` reads its solver and runs: under mpiexec, MPI's launch guard (a bad solver file,
    or any error, ends every rank) and, for one replica per rank, signals recorded as requests from the first
    moment; yields a :class:`Rank`, or None outside mpiexec."""
    setup_logging()
    if mpi_world_size() <= 1:
        release_held_signals()
        yield None
        return
    restarts.refuse_under_mpiexec(run)
    from ..comm import launch_guard
    from ..solvers.signals import signal_handlers

    requests = []
    with contextlib.ExitStack() as stack:
        if not run.parallel:
            # a rank's signals are requests from its first moment: its supervisor started it with them held, and
            # what came since is recorded now and carried out, agreed by every rank, at the first iteration. A rank
            # may stop because the others asked before its own copy of the signal arrives (its supervisor forwards
            # it late on a loaded machine): that copy is moot then, and must not kill the rank while MPI finalises.
            stack.enter_context(signal_handlers(requests, run.sigint_effect, run.sighup_effect, escalate=False,
                                                then_ignore=True))
        release_held_signals()
        yield Rank(stack.enter_context(launch_guard()), requests)


def runner_for(run, sp, rank):
    """The runner of a run (see the module docstring), the first that applies."""
    if rank is None and restarts.wants_restarts(run, sp):
        return train_restarting
    if run.parallel:
        return train_workers
    if rank is not None:
        return train_ranks
    choice = cpu_choice(run, sp)
    if choice is not None and choice.mode == "REPLICAS":
        return functools.partial(train_replicas, replicas=choice.replicas)
    return train_one


def train_restarting(sp, run, rank=None):
    """``--ranks`` / ``--max-restarts``: the job, started again after a lost rank (restarts.py)."""
    return restarts.train_with_restarts(run.argv, sp, run.ranks, run.hostfile, run.mpiexec,
                                        restarts.restarts_of(run, sp), run.min_ranks, run.snapshot, run.weights)


def train_workers(sp, run, rank=None):
    """``--workers`` / ``--devices``: CGDP's workers of this host, each rank of mpiexec one host."""
    from ..comm import Communicator
    from .cgdp import train_parallel
    from .telemetry import host_telemetry

    comm = Communicator(rank.comm, timeout=sp.collective_timeout) if rank is not None else None
    with host_telemetry(run, sp, comm) as wanted:
        result = train_parallel(sp, workers=run.workers, devices=run.devices, comm=comm, resume=run.snapshot,
                                share_activations=run.reuse, **wanted)
    run.report(result.stats, False)
    return 0


def train_replicas(sp, run, rank=None, *, replicas):
    """``replicas`` single-threaded replicas of a split batch (cpu_parallel REPLICAS): to the user one process, with
    train's signals, progress display, snapshots, trace and TensorBoard scalars."""
    from ..errors import LayerforgeError
    from ..logs import clear_cut_bar
    from .cgdp import train_parallel
    from .telemetry import host_telemetry

    try:
        with host_telemetry(run, sp, None) as wanted:
            result = train_parallel(sp, workers=replicas, sync="host", split=True, resume=run.snapshot,
                                    progress=run.progress, signal_effects=(run.sigint_effect, run.sighup_effect),
                                    share_activations=run.reuse, **wanted)
    except (LayerforgeError, KeyboardInterrupt):
        if run.progress is not None:  # worker 0's bar, when another replica's error ended the job
            clear_cut_bar()
        raise
    run.report(result.stats, True)
    return 0


def train_ranks(sp, run, rank):
    """Under mpiexec: this rank's replica, its data shard, its gradients exchanged with the other ranks'."""
    from ..backend import rank_device
    from ..comm import Communicator
    from ..cores import local_rank
    from ..solvers import get_solver
    from .rank_agreement import config_digest
    from .ranks import make_data_parallel

    mpi_comm = rank.comm
    index, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    if index != 0:
        log.setLevel(logging.WARNING)  # rank 0 logs for the job
    else:
        restarts.note_under_mpiexec(sp)
    digest = config_digest(sp, sp.as_dict())  # every key as the job set it, before each rank picks its own device
    device = {"device_id": rank_device(sp.device_id, local_rank())} if sp.solver_mode == "GPU" else {}
    solver = get_solver(sp, shard=(index, size), **device)  # one GPU per rank of a node, from device_id on
    comm = Communicator(mpi_comm, group_size=solver.param.group_size or None, timeout=sp.collective_timeout)
    make_data_parallel(solver, comm, digest=digest)
    return solve(solver, run, mpi_comm, rank.requests)


def train_one(sp, run, rank=None):
    """One process."""
    from ..solvers import get_solver

    return solve(get_solver(sp), run)


def solve(solver, run, mpi_comm=None, requests=()):
    """Train ``solver`` to its end with train's telemetry, progress display and signal effects; returns 0.
    ``requests``: what signals asked before the loop's own handlers were in place."""
    from .telemetry import start_telemetry

    if run.reuse:
        solver.share_activations()
    solver.check_memory()
    recording = start_telemetry(run, solver, mpi_comm)
    close_progress = solver.show_progress(run.progress) if solver.root and run.progress is not None else None
    if solver.root and run.progress is None:  # the progress display says a run of days; without it, this does
        from ..logs import LongRun

        long_run = LongRun(solver.param.max_iter, solver.iter)
        solver.add_callback(lambda iteration, loss: long_run.update(iteration + 1))
    try:
        solver.solve(resume_file=run.snapshot, sigint_effect=run.sigint_effect, sighup_effect=run.sighup_effect,
                     requests=requests)
        recording.finish()  # collective under mpiexec: only where every rank got here
    finally:
        if close_progress is not None:
            close_progress()
        recording.close()
    return 0


def cpu_choice(run, sp):
    """The CPU configuration of the SolverParameter ``sp`` (cpu_parallel.py), logged in one line; None on a GPU."""
    from .cpu_parallel import resolve

    choice = resolve(sp, requested=run.cpu_parallel, training=True, resume=run.snapshot)
    if choice is not None and not choice.quiet:  # a short run, untimed, says nothing
        log.info("%s", choice.describe())
    return choice
