"""The CLI side of single-host data parallelism: ``train``/``time`` with ``--workers N`` or ``--devices LIST``.

Under ``mpiexec -n NODES`` every rank is one host: it starts its own workers, accumulates their gradients
on the host, and reduces the node's sum with the other ranks through the communicator (host mode only).
"""
import contextlib
import json
import logging
import os


def add_parallel_arguments(parser):
    """``--workers``, ``--devices``, ``--sync``, ``--chunk-size`` (shared by train and time)."""
    parser.add_argument("--workers", type=int, metavar="N", help="data parallel over N worker processes on this host")
    parser.add_argument("--devices", metavar="LIST", help="data parallel over these GPUs, e.g. 0,1,2,3 (a worker each)")
    parser.add_argument("--sync", choices=("host", "tree"), help="with --workers/--devices: host = CGDP (chunks "
                        "summed on the host during backward), tree = worker 0 gathers after backward")
    parser.add_argument("--chunk-size", metavar="N|auto", help="sync host: layers with parameters per chunk, or auto")


def wants_parallel(args):
    return bool(getattr(args, "workers", None) or getattr(args, "devices", None))


def _with_comm(fn):
    from ..cores import mpi_world_size

    if mpi_world_size() <= 1:
        return fn(None)
    from ..comm import Communicator, launch_guard

    with launch_guard() as mpi_comm:
        return fn(Communicator(mpi_comm))


def train_command(args, overrides):
    """``layerforge train --workers/--devices``; returns the exit code."""
    from ..dataparallel.cgdp import train_parallel
    from ..solvers import SOLVER_REGISTRY, load_solver_param

    def go(comm):
        sp = load_solver_param(args.solver, SOLVER_REGISTRY, **overrides)  # read once, for every worker
        with host_telemetry(args, sp, comm) as wanted:
            result = train_parallel(sp, workers=args.workers, devices=args.devices, sync=args.sync,
                                    chunk_size=args.chunk_size, comm=comm, resume=args.snapshot, **wanted)
        print_report(result.stats)
        return 0

    return _with_comm(go)


def train_replicas(args, sp, choice):
    """``layerforge train`` of the SolverParameter ``sp`` on ``choice.replicas`` single-threaded replicas of a split
    batch (cpu_parallel REPLICAS): to the user one process, with train's signals, progress bar, snapshots, trace
    and TensorBoard scalars; returns the exit code."""
    from ..dataparallel.cgdp import train_parallel
    from ..errors import LayerforgeError
    from ..logs import clear_cut_bar

    progress = None if args.no_progress else args.status_interval
    try:
        with host_telemetry(args, sp, None) as wanted:
            result = train_parallel(sp, workers=choice.replicas, sync="host", split=True,
                                    resume=args.snapshot, progress=progress,
                                    signal_effects=(args.sigint_effect, args.sighup_effect), **wanted)
    except (LayerforgeError, KeyboardInterrupt):
        if progress is not None:  # worker 0's bar, when another replica's error ended the job
            clear_cut_bar()
        raise
    log = logging.getLogger("layerforge")
    print_report(result.stats, out=lambda line: log.info("%s", line.strip()), chunks=False)  # to stderr, as train's
    return 0


@contextlib.contextmanager
def host_telemetry(args, sp, comm):
    """The trace and TensorBoard scalars that ``--trace`` / ``--tensorboard`` (or the keys of the SolverParameter
    ``sp``) ask of a job of workers: this process records the host's spans (pid 1000 + node) and writes the file
    with every worker's part; worker 0 writes the scalars. Yields ``train_parallel``'s ``trace`` and
    ``tensorboard``."""
    from .. import trace
    from .trace import Telemetry, telemetry_wanted

    path, window, logdir = telemetry_wanted(args, sp)
    mpi_comm = comm.comm if comm is not None and comm.size > 1 else None
    if path:
        node = comm.rank if mpi_comm is not None else 0
        trace.start(path, trace.parse_window(window), comm=mpi_comm, pid=1000 + node,
                    process_name=f"node {node} host" if mpi_comm is not None else "host", host=True)
    recording = Telemetry(bool(path), mpi_comm, None)
    try:
        yield {"trace": window if path else None, "tensorboard": logdir}
        recording.finish()  # collective under mpiexec: only where every node got here
    finally:
        recording.close()


def time_command(args):
    """``layerforge time --model NET --workers G``: Table 3 phases and Table 4 per-chunk times."""
    from ..dataparallel.cgdp import train_parallel
    from ..solvers import SOLVER_REGISTRY, load_solver_param

    iterations = args.iterations + 1  # the first is the warm-up, left out of the means
    sp = load_solver_param({"net": os.path.abspath(args.model), "base_lr": 0.001, "momentum": 0.9,
                            "max_iter": iterations, "snapshot_after_train": False}, SOLVER_REGISTRY)

    def go(comm):
        with host_telemetry(args, sp, comm) as wanted:  # --trace: the workers' iterations, the host's sums
            result = train_parallel(sp, workers=args.workers, devices=args.devices, sync=args.sync or "host",
                                    chunk_size=args.chunk_size or 1, comm=comm, iterations=iterations,
                                    batch=args.batch, log=False, **wanted)
        if args.json:
            print(json.dumps(result.stats, indent=1))
        else:
            print_report(result.stats)
        return 0

    return _with_comm(go)


def print_report(stats, out=print, chunks=True):
    """The phases (Table 3) and, with ``chunks``, the per-chunk transfer times (Table 4) and, for host mode, the
    cost model."""
    ph = stats["phases_ms"]
    if not ph:
        return
    out(f"Data parallel: {stats['G']} workers, sync {stats['sync'].lower()}, chunk_size {stats.get('chunk_size')}, "
        f"{stats['iterations']} iterations after 1 warm-up (worker 0, ms per iteration)")
    exposed = 100.0 * ph["exchange"] / ph["backward"] if ph["backward"] else 0.0
    out(f"  forward {ph['forward']:.3f}  backward {ph['backward']:.3f}  exposed exchange {ph['exchange']:.3f} "
        f"({exposed:.1f}% of backward)  update {ph['update']:.3f}  iteration {ph['iteration']:.3f}")
    if not chunks:
        return
    ms = stats["chunks_ms"]
    names = [name for _, name, _ in stats["units"]]
    chunk_names = sorted({k.split(":", 1)[1] for k in ms}, key=lambda n: names.index(n.split("..")[0]))
    if chunk_names:
        width = max(len(n) for n in chunk_names + ["chunk"])
        out(f"  {'chunk':<{width}}  {'copy-out ms':>11}  {'accumulate ms':>13}  {'copy-back ms':>12}")
        for n in chunk_names:
            cells = [ms.get(f"{kind}:{n}") for kind in ("copy_out", "accumulate", "copy_back")]
            out(f"  {n:<{width}}  " + "  ".join(f"{'-' if v is None else f'{v:.3f}':>{w}}"
                                               for v, w in zip(cells, (11, 13, 12))))
    if stats["sync"] == "HOST" and stats.get("layer_backward_ms") and stats.get("rates"):
        out("  cost model (docs/cgdp.md), predicted per G:")
        out(prediction_text(stats, indent="  "))


def predict_rows(stats, Gs=(2, 4, 8)):
    """Cost-model rows per G from a host-mode run's stats: host T and tree T' (ms) at chunk size 1, their
    ratio, the winner, the speed-ups over one replica and the chunk size the model prefers (with its T)."""
    from ..dataparallel.cgdp.cost_model import from_stats

    m = from_stats(stats)
    rows = []
    for G in Gs:
        p, best = m.predict(G, 1), m.best_chunk_size(G)
        rows.append({"G": G, "host_ms": 1000 * p["host"], "tree_ms": 1000 * p["tree"], "ratio": p["ratio"],
                     "winner": p["winner"], "speedup_host": p["speedup_host"], "speedup_tree": p["speedup_tree"],
                     "best_chunk_size": best, "best_host_ms": 1000 * m.host(G, best)})
    return rows


def prediction_text(stats, Gs=(2, 4, 8), indent=""):
    """:func:`predict_rows` as a table (text lines, each starting with ``indent``)."""
    header = ("G", "host T ms", "tree T' ms", "T'/T", "winner", "speed-up host", "speed-up tree", "best chunk_size")
    lines = [indent + "  ".join(f"{h:>{w}}" for h, w in zip(header, (2, 10, 10, 5, 6, 13, 13, 15)))]
    for r in predict_rows(stats, Gs):
        lines.append(f"{indent}{r['G']:>2}  {r['host_ms']:10.2f}  {r['tree_ms']:10.2f}  {r['ratio']:5.2f}  "
                     f"{r['winner']:>6}  {r['speedup_host']:13.2f}  {r['speedup_tree']:13.2f}  "
                     f"{r['best_chunk_size']:>15}")
    return "\n".join(lines)
