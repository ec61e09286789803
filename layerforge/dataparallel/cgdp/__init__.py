"""Data parallel training over several workers or devices of one host (IBM's CPU-GPU data parallel, CGDP).

    from layerforge.dataparallel.cgdp import train_parallel
    result = train_parallel("solver.yaml", workers=2, sync="host", chunk_size="auto")

Each worker process holds a replica built from the same solver file and reads its own data shard. With
``sync: host`` gradients go to shared host memory chunk by chunk during backward and host threads sum them
(layerforge/dataparallel/cgdp/host.py); with ``sync: tree`` worker 0 gathers, updates and broadcasts after backward
(tree.py). Under ``mpiexec`` every rank is one host: its accumulated chunks go through the communicator's
allreduce. docs/cgdp.md has the design, the cost model (cost_model.py) and measurements.
"""
import contextlib

from ...errors import LayerforgeError
from .chunks import ChunkSearch, make_chunks, param_units, parse_chunk_size
from .pool import Result, WorkerPool, run_parallel
from .workers import WorkerOptions

__all__ = ["ChunkSearch", "Result", "WorkerOptions", "WorkerPool", "host_comm", "make_chunks", "param_units",
           "parse_chunk_size", "run_parallel", "train_parallel"]


def train_parallel(source, workers=None, devices=None, sync=None, chunk_size=None, comm=None, iterations=None,
                   batch=None, resume=None, log=True, split=False, setup=None, progress=None, signal_effects=None,
                   trace=None, tensorboard=None, share_activations=False, **overrides):
    """Train the solver of ``source`` (a YAML path, a dict or a SolverParameter) on several workers; returns a
    :class:`Result`. The solver file is read here, once: the workers get the SolverParameter.

    Args:
        workers: number of CPU worker processes, or None with ``devices`` (GPU ids, one worker each).
        sync, chunk_size: override the solver's ``sync`` (``"host"``/``"tree"``) and ``chunk_size``.
        comm: a :class:`~layerforge.comm.Communicator` over hosts (one rank per host), or None.
        iterations: run exactly this many iterations (timing) instead of ``solve()`` to max_iter.
        batch: per-worker batch size override; resume: a ``.solverstate.npz`` to resume from.
        split: the net's batch is the host's whole batch, each worker computing 1/G of it (WorkerOptions.split).
        setup: an importable ``fn(g, solver)`` each worker runs once its solver is built.
        progress: worker 0 shows a progress bar (a status line every ``progress`` seconds off a terminal).
        signal_effects: ``(sigint_effect, sighup_effect)`` of ``layerforge train`` (WorkerPool), or None.
        trace: the window (text, as ``--trace-iterations``) the workers record; their parts are absorbed into this
            process's trace, which the caller started (``trace.start(..., host=True)``) and finishes. None: none.
        tensorboard: a folder where worker 0 writes the job's TensorBoard scalars, or None.
        share_activations: each worker's nets share their activations' storage (``Solver.share_activations``).
        overrides: other solver keys (``max_iter=10``).
    """
    from ...solvers.param import load_solver_param
    from ...solvers.solver import SOLVER_REGISTRY

    if sync is not None:
        overrides["sync"] = sync.upper()
    if chunk_size is not None:
        overrides["chunk_size"] = str(chunk_size)
    sp = load_solver_param(source, SOLVER_REGISTRY, **overrides)
    if devices is not None:
        devices = [int(d) for d in (devices.split(",") if isinstance(devices, str) else devices)]
        if workers is not None and workers != len(devices):
            raise LayerforgeError(f"--workers {workers} does not match the {len(devices)} devices given")
        workers = len(devices)
    if not workers:
        raise LayerforgeError("give the number of workers (--workers N) or the devices (--devices 0,1)")
    nodes, node = (comm.size, comm.rank) if comm is not None else (1, 0)
    options = WorkerOptions(sp, None, sp.sync, sp.chunk_size, devices, batch, node, nodes,
                            iterations, resume, log and node == 0, setup, split, progress, trace, tensorboard,
                            share_activations)
    search = (sp.chunk_search_interval, sp.chunk_search_step, sp.chunk_search_range)
    return run_parallel(int(workers), options, search=search, comm=comm, signal_effects=signal_effects)


@contextlib.contextmanager
def host_comm():
    """A Communicator over the hosts (one rank each) under mpiexec, inside MPI's launch guard; None outside."""
    from ...cores import mpi_world_size

    if mpi_world_size() <= 1:
        yield None
        return
    from ...comm import Communicator, launch_guard

    with launch_guard() as mpi_comm:
        yield Communicator(mpi_comm)
