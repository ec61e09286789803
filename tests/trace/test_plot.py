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
