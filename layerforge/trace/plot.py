"""A Gantt picture of one iteration of a trace: one row per rank x thread, one bar per span, coloured by category."""
from .events import TraceFileError, row_rank
from .summary import compute_threads, iteration_of, names, spans

# one colour per category (matplotlib's tab10), fixed so that pictures of different runs compare
COLOURS = {"forward": "tab:blue", "backward": "tab:orange", "update": "tab:green", "data": "tab:red",
           "comm": "tab:purple", "host": "tab:brown", "test": "tab:pink", "snapshot": "tab:gray"}
OTHER_COLOUR = "tab:olive"


def plot_iteration(doc, out, iteration=None, path="trace"):
    """Write ``out`` (PNG, SVG or PDF, by its extension) with iteration ``iteration`` of ``doc`` (default the
    first one the trace holds) on every rank's rows; returns the iteration drawn.

    Time runs from the iteration's first span on a compute thread over all ranks (:func:`time_window`), in
    milliseconds; a span of another thread that began before it (a decode prefetched during the previous
    iteration) is drawn from there on. Spans inside another span of
    the same row (an engine trial in a layer's forward) are drawn thinner, on top. Each process's
    ``iteration`` span is the grey frame behind its rows; waits (spans named ``wait``) are hatched; bars wide
    enough carry their name.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = spans(doc)
    which = iteration_of(events)
    present = sorted({k for k in which.values() if k is not None})
    if not present:
        raise TraceFileError(f"{path}: no span belongs to an iteration")
    if iteration is None:
        iteration = present[0]
    if iteration not in present:
        raise TraceFileError(f"{path}: no iteration {iteration} in this trace (it holds {_ranges(present)})")
    chosen = [e for e in events if which[id(e)] == iteration]
    origin, end = time_window(doc, chosen)
    width = end - origin or 1.0
    chosen = [e for e in chosen if e["ts"] + e["dur"] > origin or e["ts"] >= origin]  # cut at the origin
    processes, threads = names(doc)
    rows = sorted({(e["pid"], e["tid"]) for e in chosen if e["cat"] != "iteration"},
                  key=lambda r: (r[0], row_rank(threads.get(r, "")), r[1]))
    row_of = {row: len(rows) - 1 - k for k, row in enumerate(rows)}  # the first row at the top

    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(rows)))
    for e in chosen:  # each process's iteration frame, behind its rows
        if e["cat"] == "iteration":
            mine = [row_of[r] for r in rows if r[0] == e["pid"]]
            if mine:
                lo, hi = min(mine), max(mine)
                ax.broken_barh([_bar(e, origin)], (lo - 0.45, hi - lo + 0.9),
                               facecolors="whitesmoke", edgecolors="silver", zorder=0)
    seen = set()
    for row in rows:
        mine = sorted((e for e in chosen if (e["pid"], e["tid"]) == row and e["cat"] != "iteration"),
                      key=lambda e: (e["ts"], -e["dur"]))
        open_ends = []  # ends of the spans that contain the current one: its nesting depth
        for e in mine:
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            depth = len(open_ends)
            open_ends.append(e["ts"] + e["dur"])
            height = 0.8 * 0.6 ** depth
            colour = COLOURS.get(e["cat"], OTHER_COLOUR)
            seen.add(e["cat"] if e["cat"] in COLOURS else "other")
            x, w = _bar(e, origin)
            ax.broken_barh([(x, w)], (row_of[row] - height / 2, height), facecolors=colour, edgecolors="black",
                           linewidth=0.3, zorder=1 + depth, hatch="///" if e["name"] == "wait" else None)
            if w * 1e3 > 0.06 * width and depth == 0:
                ax.text(x + w / 2, row_of[row], e["name"], ha="center", va="center", fontsize=7, clip_on=True,
                        zorder=10)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([_row_label(row, processes, threads) for row in reversed(rows)])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(0, width / 1e3 * 1.01)
    ax.set_xlabel("milliseconds from the iteration's first compute span")
    ax.set_title(f"iteration {iteration}")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    order = [c for c in COLOURS if c in seen] + (["other"] if "other" in seen else [])
    ax.legend(handles=[Patch(facecolor=COLOURS.get(c, OTHER_COLOUR), label=c) for c in order],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    try:
        fig.savefig(out)
    except (OSError, ValueError) as e:  # an unwritable folder, an extension matplotlib has no writer for
        raise TraceFileError(f"{out}: cannot write the picture: {e}") from None
    finally:
        plt.close(fig)
    return iteration


def time_window(doc, chosen):
    """``(origin, end)`` in microseconds of the picture of the spans ``chosen`` (one iteration's) of ``doc``: from
    the first span on a process's compute thread (its ``iteration`` frame, its input wait, its first layer) to the
    last end of any span. Spans of other threads that began earlier (a data layer's prefetch thread decodes the
    next batch while the compute thread still runs the previous iteration) do not move the origin: they would
    leave most of the picture empty. A trace with no compute thread starts at its first span."""
    compute = compute_threads(doc, chosen)
    starts = [e["ts"] for e in chosen if compute.get(e["pid"]) == e["tid"]] or [e["ts"] for e in chosen]
    return min(starts), max(e["ts"] + e["dur"] for e in chosen)


def _bar(e, origin):
    """``(x, width)`` in milliseconds of span ``e`` from ``origin`` (us), cut at the origin."""
    start = max(e["ts"], origin)
    return (start - origin) / 1e3, (e["ts"] + e["dur"] - start) / 1e3


def _row_label(row, processes, threads):
    pid, tid = row
    return f"{processes.get(pid, f'pid {pid}')} · {threads.get(row, f'tid {tid}')}"


def _ranges(values):
    """``[5, 6, 7, 9]`` -> ``"5-7, 9"``."""
    out, start, prev = [], None, None
    for v in values + [None]:
        if start is not None and (v is None or v != prev + 1):
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = None
        if v is not None and start is None:
            start = v
        prev = v
    return ", ".join(out)
