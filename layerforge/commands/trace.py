"""``layerforge trace summary|plot|merge``: read the Chrome traces that ``--trace FILE`` records (docs/trace.md).

    layerforge trace summary run.json [--json]           per-layer and per-rank tables
    layerforge trace plot run.json -o timeline.png       one iteration as a Gantt picture (PNG, SVG or PDF)
    layerforge trace merge all.json run.rank0.json run.rank1.json

Also here, for ``layerforge train`` and ``layerforge time``: :func:`add_run_arguments` (``--trace``,
``--trace-iterations``, ``--tensorboard``); what they, or the solver's keys, ask for is recorded by
layerforge/dataparallel/telemetry.py.
"""
import argparse
import json

from ..trace import DEFAULT_WINDOW, load_trace, merge_files, parse_window, plot_iteration, summarize

HELP = "summarise, plot or merge Chrome traces written by --trace (per-layer, per-rank timelines)"


def add_arguments(parser):
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("summary", help="per-layer forward/backward table; per rank the exposed communication, "
                                       "overlap ratio, data wait; the slowest rank of each iteration")
    p.add_argument("file", help="a trace written by --trace (or layerforge trace merge)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")
    p = sub.add_parser("plot", help="a Gantt picture of one iteration: rows = rank x thread, coloured by category")
    p.add_argument("file", help="a trace written by --trace (or layerforge trace merge)")
    p.add_argument("-o", "--output", required=True, metavar="PICTURE", help="timeline.png, .svg or .pdf")
    p.add_argument("--iteration", type=int, metavar="K", help="which iteration (default: the first in the trace)")
    p = sub.add_parser("merge", help="merge traces written per rank (finish(per_rank=True)) into one file, "
                                     "applying the clock offsets they recorded")
    p.add_argument("output", help="the merged trace to write")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="per-rank trace files")


def run(args):
    if args.action == "summary":
        result = summarize(load_trace(args.file))
        if args.json:
            print(json.dumps(result, indent=1))
        else:
            print_summary(args.file, result)
    elif args.action == "plot":
        k = plot_iteration(load_trace(args.file), args.output, args.iteration, path=args.file)
        print(f"wrote {args.output} (iteration {k})")
    else:
        merge_files(args.output, args.inputs)
        print(f"wrote {args.output} ({len(args.inputs)} inputs)")
    return 0


def print_summary(path, result):
    """The tables of ``layerforge trace summary`` (milliseconds per iteration)."""
    from .summary import print_table

    ranks, iterations = result["ranks"], result["iterations"]
    print(f"{path}: {len(ranks)} process(es), iterations {_span_text(iterations)}; milliseconds per iteration")
    if result["layers"]:
        print()
        rows = [(r["name"], r["type"] or "-", _ms(r["forward_ms"]), _ms(r["backward_ms"]),
                 _ms(r["forward_ms"] + r["backward_ms"])) for r in result["layers"]]
        print_table(("layer", "type", "forward", "backward", "total"), rows, left=2)
        if result["trials"]["count"]:
            print(f"(AUTO engine trials inside these: {result['trials']['count']} spans, "
                  f"{result['trials']['ms']:.3f} ms in all)")
    print()
    host = any(r["host_ms"] for r in ranks)  # a CGDP run: the host's accumulations (and GPU workers' copies)
    rows = [(r["name"], _ms(r["iteration_ms"]), _ms(r["busy_ms"]), _ms(r["forward_ms"]), _ms(r["backward_ms"]),
             _ms(r["update_ms"]), _ms(r["comm_ms"]), _ms(r["exposed_ms"]),
             "-" if r["overlap"] is None else f"{100 * r['overlap']:.0f}%", _ms(r["data_wait_ms"]))
            + ((_ms(r["host_ms"]),) if host else ()) for r in ranks]
    print_table(("process", "iteration", "busy", "forward", "backward", "update", "comm", "exposed comm", "overlap",
                 "data wait") + (("host",) if host else ()), rows, left=1)
    if len(ranks) > 1:
        print()
        names = {r["pid"]: r["name"] for r in ranks}
        rows = []
        for it in result["per_iteration"]:
            busy = it["busy_ms"]
            slowest = it["slowest"]
            fastest = min(busy.values())
            rows.append((str(it["iter"]), names.get(slowest, str(slowest)), _ms(busy[slowest]), _ms(fastest),
                         _ms(busy[slowest] - fastest)))
        print_table(("iteration", "slowest", "its busy", "fastest busy", "spread"), rows, left=2)


def _ms(value):
    return f"{value:.3f}"


def _span_text(values):
    if not values:
        return "none"
    return f"{values[0]}-{values[-1]}" if values == list(range(values[0], values[-1] + 1)) else \
        ", ".join(map(str, values))


def checked_window(text):
    """argparse type of ``--trace-iterations``: the text, once :func:`window_argument` accepts it."""
    window_argument(text)
    return text


def window_argument(text):
    """argparse type of ``--trace-iterations``: ``A:B`` -> ``(A, B)`` (see ``layerforge.trace.parse_window``)."""
    try:
        return parse_window(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_run_arguments(parser):
    """``--trace FILE``, ``--trace-iterations A:B`` and ``--tensorboard DIR``, for ``train`` and ``time``."""
    a, b = DEFAULT_WINDOW
    parser.add_argument("--trace", metavar="FILE.json",
                        help="record a Chrome / Perfetto trace of the iterations --trace-iterations names "
                             "(every rank's, in one file under mpiexec); read it with layerforge trace")
    parser.add_argument("--trace-iterations", type=checked_window, metavar="A:B",
                        help=f"iterations A to B-1 go into --trace (default: the solver's trace_iterations, "
                             f"{a}:{b}; 'A:' from A on; 'all')")
    parser.add_argument("--tensorboard", metavar="DIR",
                        help="write TensorBoard scalars (loss, test outputs, learning rate, img/s, data wait, "
                             "exposed communication) to DIR")
