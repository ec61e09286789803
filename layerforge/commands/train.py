"""``layerforge train --solver S``: train a net as its solver file describes (Caffe's ``caffe train``)."""
import argparse
import logging

from . import add_collective_timeout, add_decode_workers, add_net_state, apply_decode_workers, train_state
from .data_parallel import add_parallel_arguments, print_report, wants_parallel
from ..errors import LayerforgeError

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
    parser.add_argument("--no-reuse", action="store_true",
                        help="give every activation of the train and test nets its own storage (by default they "
                             "share it, as layerforge time's do: intermediate blobs hold other blobs' values after a "
                             "pass)")
    parser.add_argument("--status-interval", type=float, default=60.0, metavar="SECONDS",
                        help="when stderr is not a terminal, log a progress line with rate and ETA this often")
    parser.add_argument("--allreduce", choices=("auto", "recursive", "topology", "ring", "doubling", "hierarchical",
                                                "mpi", "nccl"),
                        help="gradient allreduce under mpiexec (overrides the solver's allreduce)")
    add_collective_timeout(parser, "overrides the solver's collective_timeout, default 600")
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
    """The solver keys the command line sets (``--gpu``, ``--max-iter``, ``--sync`` ...), applied once, as the file is
    read (:func:`solver_param`)."""
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
    if getattr(args, "collective_timeout", None) is not None:
        overrides["collective_timeout"] = args.collective_timeout
    if getattr(args, "weights", None):
        overrides["weights"] = args.weights
    if wants_parallel(args):  # CGDP's workers: their exchange
        if getattr(args, "sync", None):
            overrides["sync"] = args.sync.upper()
        if getattr(args, "chunk_size", None) is not None:
            overrides["chunk_size"] = str(args.chunk_size)
    overrides.update(train_state(args))
    return overrides


def solver_param(args):
    """The solver file of ``args`` with the command line's overrides: read and normalised once in this process, and
    handed down to whichever runner runs."""
    from ..solvers import SOLVER_REGISTRY, load_solver_param

    return load_solver_param(args.solver, SOLVER_REGISTRY, **solver_overrides(args))


# train's options that go to the runner as they are (TrainRun's attributes of the same names)
RUN_OPTIONS = ("snapshot", "weights", "argv", "ranks", "hostfile", "mpiexec", "max_restarts", "min_ranks", "workers",
               "devices", "cpu_parallel", "sigint_effect", "sighup_effect", "trace", "trace_iterations", "tensorboard")


def train_run(args):
    """What the command line asks of the run besides the solver (layerforge/dataparallel/runners.py)."""
    from ..dataparallel.runners import TrainRun

    given = {name: getattr(args, name) for name in RUN_OPTIONS if getattr(args, name, None) is not None}
    return TrainRun(**given, progress=None if args.no_progress else args.status_interval, report=report,
                    reuse=not args.no_reuse)


def report(stats, replicas):
    """A job of workers' phases: on stdout, or for the replicas of one split batch in the log (stderr, as
    train's other lines)."""
    if replicas:
        log = logging.getLogger("layerforge")
        print_report(stats, out=lambda line: log.info("%s", line.strip()), chunks=False)
    else:
        print_report(stats)


def run(args):
    """Read the solver once, pick the one runner for the run and call it (layerforge/dataparallel/runners.py)."""
    from ..dataparallel.runners import process_guard, runner_for

    apply_decode_workers(args)
    resolve_gpu_list(args)
    job = train_run(args)
    with process_guard(job) as rank:  # under mpiexec: a bad solver file ends every rank
        sp = solver_param(args)
        return runner_for(job, sp, rank)(sp, job, rank)
