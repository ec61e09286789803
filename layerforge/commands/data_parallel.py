"""The CLI side of single-host data parallelism: the options ``--workers N`` / ``--devices LIST`` of ``train`` and
``time``, ``time --workers`` and the report of a job of workers. Its library is layerforge/dataparallel/: the
runners of ``train`` (``runners.py``), CGDP (``cgdp/``) and a run's telemetry (``telemetry.py``).

Under ``mpiexec -n NODES`` every rank is one host: it starts its own workers, accumulates their gradients
on the host, and reduces the node's sum with the other ranks through the communicator (host mode only).
"""
import json
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


def time_command(args):
    """``layerforge time --model NET --workers G``: Table 3 phases and Table 4 per-chunk times."""
    from ..dataparallel.cgdp import host_comm, train_parallel
    from ..dataparallel.telemetry import host_telemetry
    from ..solvers import SOLVER_REGISTRY, load_solver_param

    iterations = args.iterations + 1  # the first is the warm-up, left out of the means
    sp = load_solver_param({"net": os.path.abspath(args.model), "base_lr": 0.001, "momentum": 0.9,
                            "max_iter": iterations, "snapshot_after_train": False}, SOLVER_REGISTRY)

    with host_comm() as comm, host_telemetry(args, sp, comm) as wanted:  # --trace: the workers' iterations, the sums
        result = train_parallel(sp, workers=args.workers, devices=args.devices, sync=args.sync or "host",
                                chunk_size=args.chunk_size or 1, comm=comm, iterations=iterations, batch=args.batch,
                                log=False, **wanted)
    if args.json:
        print(json.dumps(result.stats, indent=1))
    else:
        print_report(result.stats)
    return 0


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


def prediction_text(stats, Gs=(2, 4, 8), indent=""):
    """:func:`predict_rows` as a table (text lines, each starting with ``indent``)."""
    header = ("G", "host T ms", "tree T' ms", "T'/T", "winner", "speed-up host", "speed-up tree", "best chunk_size")
    lines = [indent + "  ".join(f"{h:>{w}}" for h, w in zip(header, (2, 10, 10, 5, 6, 13, 13, 15)))]
    from ..dataparallel.cgdp.cost_model import predict_rows

    for r in predict_rows(stats, Gs):
        lines.append(f"{indent}{r['G']:>2}  {r['host_ms']:10.2f}  {r['tree_ms']:10.2f}  {r['ratio']:5.2f}  "
                     f"{r['winner']:>6}  {r['speedup_host']:13.2f}  {r['speedup_tree']:13.2f}  "
                     f"{r['best_chunk_size']:>15}")
    return "\n".join(lines)
