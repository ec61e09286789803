"""Reading Caffe-format training logs (layerforge's or Caffe's own) into tables, and plotting them.

The parser reads the lines Caffe's ``tools/extra/parse_log.py`` reads: the glog prefix gives wall time,
``Iteration N ...`` the iteration, ``lr = R`` the learning rate, and ``Train net output #k: name = v`` /
``Test net output #k: name = v`` the scores; layerforge's ``Iteration N (... iter/s, ..., R img/s)`` adds the
training rate (``images_per_second``) inside Caffe's brackets, where Caffe's parsers do not look.
"""
import datetime
import re

from .errors import LayerforgeError

_PREFIX = re.compile(r"^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d+)")
_ITER = re.compile(r"Iteration (\d+)")
_LR = re.compile(r"Iteration (\d+), lr = ([-+\d.eEinfa]+)")
_RATE = re.compile(r"Iteration (\d+) \([^)]*, ([-+\d.eEinfa]+) img/s\)")
_OUTPUT = re.compile(r"(Train|Test) net output #\d+: (\S+) = ([-+\d.eEinfa]+)")


def parse_log(path):
    """Rows of train and test values from a log file.

    Returns:
        ``(train, test)``: lists of dicts with ``iteration``, ``seconds`` (since the first line) and one
        key per output (plus ``lr`` and, from layerforge's logs, ``images_per_second`` for train rows).
    """
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError as e:
        raise LayerforgeError(f"{path}: cannot read the log: {e.strerror}") from None
    train, test = [], []
    iteration, start, seconds = None, None, 0.0
    rows = {"Train": train, "Test": test}
    for line in lines:
        m = _PREFIX.match(line)
        if m:
            month, day, hh, mm, ss, frac = m.groups()
            t = datetime.datetime(2000, int(month), int(day), int(hh), int(mm), int(ss), int(frac[:6].ljust(6, "0")))
            start = start or t
            seconds = (t - start).total_seconds()
            if seconds < 0:  # the log crossed a new year
                seconds += 366 * 86400
        m = _LR.search(line)
        if m:
            _row(train, int(m.group(1)), seconds)["lr"] = float(m.group(2))
            continue
        m = _RATE.search(line)
        if m:
            _row(train, int(m.group(1)), seconds)["images_per_second"] = float(m.group(2))
        m = _ITER.search(line)
        if m:
            iteration = int(m.group(1))
        m = _OUTPUT.search(line)
        if m and iteration is not None:
            kind, name, value = m.groups()
            _row(rows[kind], iteration, seconds)[name] = float(value)
    if not train and not test:
        raise LayerforgeError(f"{path}: no 'Iteration N' / 'net output' lines: not a Caffe-format training log")
    return train, test


def _row(rows, iteration, seconds):
    if not rows or rows[-1]["iteration"] != iteration:
        rows.append({"iteration": iteration, "seconds": seconds})
    return rows[-1]


def plot_log(path, out, x="iteration"):
    """Write a PNG of train loss and test outputs (accuracy, loss) against ``x`` (iteration or seconds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, test = parse_log(path)
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4)  # one cycle over both y axes
    for rows, kind, style in ((train, "train", "-"), (test, "test", "o-")):
        names = sorted({k for r in rows for k in r} - {"iteration", "seconds", "lr", "images_per_second"})
        for name in names:
            pts = [(r[x], r[name]) for r in rows if name in r]
            if pts:
                target = ax if "loss" in name else _accuracy_axis(ax)
                target.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{kind} {name}", markersize=3,
                            color=next(colors))
    ax.set_xlabel("iteration" if x == "iteration" else "seconds")
    ax.set_ylabel("loss")
    handles, labels = [], []
    for a in fig.axes:
        h, l = a.get_legend_handles_labels()
        handles += h
        labels += l
    ax.legend(handles, labels, loc="center right")
    ax.set_title(str(path))
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return train, test


def _accuracy_axis(ax):
    if not hasattr(ax, "_layerforge_twin"):
        ax._layerforge_twin = ax.twinx()
        ax._layerforge_twin.set_ylabel("accuracy / other outputs")
    return ax._layerforge_twin
