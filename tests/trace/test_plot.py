"""``trace plot``: a Gantt picture of one iteration, PNG and SVG."""
import xml.etree.ElementTree as ET

import pytest

from layerforge.trace.events import TraceFileError
from layerforge.trace.plot import plot_iteration

from .test_summary import two_ranks


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_writes_the_picture(tmp_path, suffix):
    out = tmp_path / f"timeline.{suffix}"
    assert plot_iteration(two_ranks(), str(out)) == 0  # the first iteration by default
    data = out.read_bytes()
    if suffix == "png":
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
    else:
        root = ET.fromstring(data)
        assert root.tag.endswith("svg")
        text = data.decode()
        # rows are rank x thread, top to bottom; the legend names the categories drawn
        for label in ("rank 0 · compute", "rank 0 · comm", "rank 1 · compute", "forward", "backward", "comm",
                      "update", "data", "iteration 0"):
            assert label in text, label


def test_chosen_iteration(tmp_path):
    out = tmp_path / "t.svg"
    assert plot_iteration(two_ranks(), str(out), iteration=1) == 1
    assert "iteration 1" in out.read_text()


def test_missing_iteration_and_bad_output(tmp_path):
    with pytest.raises(TraceFileError, match=r"run.json: no iteration 7 in this trace \(it holds 0-1\)"):
        plot_iteration(two_ranks(), str(tmp_path / "t.png"), iteration=7, path="run.json")
    with pytest.raises(TraceFileError, match=r"t.xyz: cannot write the picture"):
        plot_iteration(two_ranks(), str(tmp_path / "t.xyz"))
    with pytest.raises(TraceFileError, match="cannot write the picture"):
        plot_iteration(two_ranks(), str(tmp_path / "missing" / "t.png"))


def test_iteration_drawn_from_its_first_compute_span(tmp_path):
    """A decode prefetched during the previous iteration (args.iter of the next) does not stretch the picture:
    it starts at the iteration's first compute-thread span, and the decode's bar is cut there."""
    from layerforge.trace.plot import time_window
    from layerforge.trace.summary import iteration_of, spans

    from .test_summary import COMPUTE, DATA, X, metadata

    doc = {"traceEvents": metadata([0]) + [
        X(0, COMPUTE, "iteration", "iteration", 0, 1000, 0),
        X(0, COMPUTE, "forward", "conv1", 0, 900, 0),
        X(0, DATA, "data", "decode", 100, 300, 1),  # iteration 1's input, decoded early in iteration 0
        X(0, DATA, "data", "decode", 200, 1100, 1),  # another, still running when iteration 1 starts
        X(0, COMPUTE, "iteration", "iteration", 1000, 1500, 1),
        X(0, COMPUTE, "forward", "conv1", 1000, 1400, 1)]}
    events = spans(doc)
    which = iteration_of(events)
    chosen = [e for e in events if which[id(e)] == 1]
    assert time_window(doc, chosen) == (1000, 1500)
    out = tmp_path / "t.svg"
    assert plot_iteration(doc, str(out), iteration=1) == 1
    text = out.read_text()
    assert "milliseconds from the iteration's first compute span" in text and "data" in text
    # without a compute thread's span (a trace of one decode thread) the picture starts at the first span
    only_data = [e for e in chosen if e["cat"] == "data"]
    assert time_window(doc, only_data) == (100, 1100)
