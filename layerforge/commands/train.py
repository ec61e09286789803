"""``layerforge train --solver S``: train a net as its solver file describes (Caffe's ``caffe train``)."""
import argparse
import logging

from . import add_decode_workers, add_net_state, apply_decode_workers, train_state
from ..errors import LayerforgeError
from ..logs import setup_logging

HELP = "train a net from a solver YAML (resume with --snapshot, fine-tune with --weights)"


def add_arguments(parser):
    add_decode_workers(parser)
    parser.add_argument("--solver", required=True, help="the solver (YAML, or Caffe's .prototxt)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--snapshot", metavar="FILE",
                       help="resume from a .solverstate.npz snapshot (or Caffe's .solverstate / .solverstate.h5)")
    start.add_argument("--weights", metavar="FILE",
                       help="start from these weights (.npz, .caffemodel, .caffemodel.h5), e.g. to fine-tune")
    device = parser.add_mutually_exclusive_group()
    device.add_argument("--gpu", type=gpu_list, metavar="N|LIST|all",
                        help="train on GPU N (overrides solver_mode/device_id); a list (0,1) or all, Caffe's -gpu "
                             "forms, trains data parallel over them as --devices does")
    device.add_argument("--cpu", action="store_true", help="train on the CPU whatever solver_mode says")
    parser.add_argument("--max-iter", type=int, metavar="N", help="override the solver's max_iter")
    parser.add_argument("--iter-size", type=int, metavar="N", help="override the solver's iter_size")
    parser.add_argument("--sigint-effect", choices=("snapshot", "stop", "none"), default="stop",
                        help="what Ctrl-C / SIGTERM does (Caffe's meanings): stop = end training, writing the final "
                             "snapshot (default); snapshot = snapshot and go on; none = ignore")
    parser.add_argument("--sighup-effect", choices=("snapshot", "stop", "none"), default="snapshot",
                        help="what SIGHUP does (default: snapshot and go on)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar on a terminal and no status lines otherwise")
    parser.add_argument("--status-interval", type=float, default=60.0, metavar="SECONDS",
                        help="when stderr is not a terminal, log a progress line with rate and ETA this often")
    parser.add_argument("--allreduce", choices=("auto", "recursive", "topology", "ring", "doubling", "hierarchical",
                                                "mpi", "nccl"),
                        help="gradient allreduce under mpiexec (overrides the solver's allreduce)")
    from .data_parallel import add_parallel_arguments
    from .trace import add_run_arguments

    add_run_arguments(parser)  # --trace FILE, --trace-iterations A:B, --tensorboard DIR (docs/trace.md)
    add_parallel_arguments(parser)  # --workers/--devices/--sync/--chunk-size: layerforge/dataparallel/cgdp (docs/cgdp.md)
    add_cpu_parallel_argument(parser)
    add_net_state(parser)
    from ..dataparallel.restarts import add_restart_arguments

    add_restart_arguments(parser)  # --ranks/--hostfile/--mpiexec/--max-restarts/--min-ranks (docs/distributed.md)


def gpu_list(text):
    """``--gpu``'s value, as Caffe's ``-gpu`` takes it: a device, a comma-separated list of devices, or ``all``."""
    if text.strip().lower() == "all":
        return "all"
    try:
        devices = [int(d) for d in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a GPU number, a list such as 0,1, or all") from None
    if min(devices) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: GPU numbers are not negative")
    return devices[0] if len(devices) == 1 else devices


def resolve_gpu_list(args):
    """``--gpu 0,1`` / ``--gpu all``: the run is data parallel over those devices (``args.devices``); one device
    stays ``args.gpu``."""
    gpu = getattr(args, "gpu", None)
    if not isinstance(gpu, (list, str)):
        return
    if getattr(args, "devices", None):
        raise LayerforgeError(f"--gpu {gpu if isinstance(gpu, str) else ','.join(map(str, gpu))} and --devices "
                              f"{args.devices}: give the devices once")
    if gpu == "all":
        from ..backend import gpu_count
        gpu = list(range(gpu_count("--gpu all")))
    if len(gpu) == 1:
        args.gpu = gpu[0]
    else:
        args.gpu, args.devices = None, ",".join(map(str, gpu))


def add_cpu_parallel_argument(parser):
    parser.add_argument("--cpu-parallel", type=str.upper, choices=("AUTO", "THREADS", "REPLICAS"),
                        help="how a CPU run uses the cores (overrides the solver's cpu_parallel): one process on "
                             "all of them, one single-threaded replica per core, or the faster for this net "
                             "(AUTO: a short trial, remembered; docs/performance.md)")


def solver_overrides(args):
    overrides = {}
    if args.gpu is not None:
        overrides.update(solver_mode="GPU", device_id=args.gpu)
    elif getattr(args, "cpu", False):
        overrides["solver_mode"] = "CPU"
    if getattr(args, "max_iter", None) is not None:
        overrides["max_iter"] = args.max_iter
    if getattr(args, "iter_size", None) is not None:
        overrides["iter_size"] = args.iter_size
    if getattr(args, "allreduce", None):
        overrides["allreduce"] = args.allreduce
    if getattr(args, "weights", None):
        overrides["weights"] = args.weights
    overrides.update(train_state(args))
    return overrides


def solver_param(args):
    """The solver file of ``args`` with the command line's overrides, read once here and handed down."""
    from ..solvers import SOLVER_REGISTRY, load_solver_param

    return load_solver_param(args.solver, SOLVER_REGISTRY, **solver_overrides(args))


def run(args):
    apply_decode_workers(args)
    resolve_gpu_list(args)
    from ..cores import mpi_world_size
    from ..dataparallel import restarts
    from ..dataparallel.supervisor import release_held_signals
    from .data_parallel import train_command, wants_parallel

    if mpi_world_size() > 1:
        restarts.refuse_under_mpiexec(args)
    else:
        sp = solver_param(args)
        if restarts.wants_restarts(args, sp):  # this process starts the job (mpiexec), and again after a failure
            setup_logging()
            return restarts.train_with_restarts(args.argv, sp, args.ranks, args.hostfile, args.mpiexec,
                                                restarts.restarts_of(args, sp), args.min_ranks, args.snapshot,
                                                args.weights)
    if wants_parallel(args):  # several workers/devices on this host (and MPI ranks as hosts)
        release_held_signals()
        setup_logging()
        return train_command(args, solver_overrides(args))

    if mpi_world_size() > 1:
        from ..comm import launch_guard
        from ..solvers.signals import signal_handlers

        # a rank's signals are requests from its first moment: its supervisor started it with them held, and
        # what came since is recorded now and carried out, agreed by every rank, at the first iteration. A rank
        # may stop because the others asked before its own copy of the signal arrives (its supervisor forwards
        # it late on a loaded machine): that copy is moot then, and must not kill the rank while MPI finalises.
        requests = []
        with signal_handlers(requests, args.sigint_effect, args.sighup_effect, escalate=False, then_ignore=True):
            release_held_signals()
            with launch_guard() as mpi_comm:  # a bad solver file ends every rank: read inside
                return train(args, solver_param(args), mpi_comm, requests)
    release_held_signals()
    choice = cpu_choice(args, sp)
    if choice is not None and choice.mode == "REPLICAS":
        from .data_parallel import train_replicas

        return train_replicas(args, sp, choice)
    return train(args, sp)


def cpu_choice(args, sp):
    """The CPU configuration of the SolverParameter ``sp`` (layerforge/dataparallel/cpu_parallel.py), logged in one
    line; None on a GPU."""
    from ..dataparallel.cpu_parallel import resolve

    setup_logging()
    choice = resolve(sp, requested=getattr(args, "cpu_parallel", None), training=True,
                     resume=getattr(args, "snapshot", None))
    if choice is not None and not choice.quiet:  # a short run, untimed, says nothing
        logging.getLogger("layerforge").info("%s", choice.describe())
    return choice


def train(args, sp, mpi_comm=None, requests=()):
    """Build the solver of the SolverParameter ``sp`` (data parallel over ``mpi_comm`` when given) and solve;
    returns the exit code. ``requests``: what signals asked before the loop's own handlers were in place."""
    from ..solvers import get_solver

    setup_logging()
    if mpi_comm is None:
        solver = get_solver(sp)
    else:
        from ..cores import local_rank
        from ..backend import rank_device
        from ..comm import Communicator
        from ..dataparallel.rank_agreement import config_digest
        from ..dataparallel.ranks import make_data_parallel

        rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        if rank != 0:
            logging.getLogger("layerforge").setLevel(logging.WARNING)  # rank 0 logs for the job
        else:
            from ..dataparallel.restarts import note_under_mpiexec

            note_under_mpiexec(sp)
        overrides = solver_overrides(args)
        digest = config_digest(sp, overrides)  # the job's configuration, before each rank picks its own device
        if sp.solver_mode == "GPU":  # one GPU per rank of a node, from device_id on
            overrides["device_id"] = rank_device(sp.device_id, local_rank())
        solver = get_solver(sp, shard=(rank, size), **overrides)
        comm = Communicator(mpi_comm, group_size=solver.param.group_size or None)
        make_data_parallel(solver, comm, digest=digest)
    solver.check_memory()
    recording = start_telemetry(args, solver, mpi_comm)
    close_progress = solver.show_progress(args.status_interval) if solver.root and not args.no_progress else None
    try:
        solver.solve(resume_file=args.snapshot, sigint_effect=args.sigint_effect, sighup_effect=args.sighup_effect,
                     requests=requests)
        recording.finish()  # collective under mpiexec: only where every rank got here
    finally:
        if close_progress is not None:
            close_progress()
        recording.close()
    return 0


def start_telemetry(args, solver, mpi_comm=None):
    """Start recording the trace and TensorBoard scalars that ``args`` and the solver file ask for."""
    from .. import trace
    from .trace import Telemetry, telemetry_wanted

    sp = solver.param
    path, window, logdir = telemetry_wanted(args, sp)
    if path:
        trace.start(path, trace.parse_window(window), comm=mpi_comm, xp=solver.xp)
    scalars = None
    if logdir and solver.root:
        ranks = mpi_comm.Get_size() if mpi_comm is not None else 1
        images = solver.images_per_iteration()
        scalars = solver.write_scalars(logdir, images and images * ranks)
    return Telemetry(bool(path), mpi_comm, scalars)
