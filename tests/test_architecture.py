"""The layering of docs/architecture.md holds: no import cycle, no import up the levels, the picture is current."""
import importlib.util
import os
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
    spec = importlib.util.spec_from_file_location("import_graph", os.path.join(ROOT, "tools", "import_graph.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


graph_tool = _tool()


def test_the_tree_has_no_cycle_and_no_upward_import():
    assert graph_tool.problems() == []


def test_the_picture_in_the_docs_is_drawn_from_the_tree():
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    block = text.split(graph_tool.START, 1)[1].split(graph_tool.END, 1)[0]
    assert block.strip() == graph_tool.picture().strip(), "run: python tools/import_graph.py --docs"


def test_every_room_has_a_paragraph():
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    rooms = {graph_tool.room_of(m) for m in graph_tool.import_graph()} - {"__init__", "__main__"}
    missing = [r for r in sorted(rooms) if f"`{r}/`" not in text and f"`{r}.py`" not in text]
    assert missing == []


def _plant(tmp_path, files):
    for path, text in files.items():
        p = tmp_path / "layerforge" / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return str(tmp_path)


BASE = {
    "__init__.py": "from .net import Net\n",
    "errors.py": "",
    "blob.py": "from .errors import x\n",
    "layers/__init__.py": "from . import conv\n",
    "layers/conv.py": "from ..blob import Blob\nfrom ..kernels.im2col import im2col\n",
    "kernels/__init__.py": "",
    "kernels/im2col.py": "import numpy\nfrom ..errors import ShapeError\n",
    "net/__init__.py": "from .net import Net\n",
    "net/net.py": "from ..layers import conv\n",
}


def _problems_with(tmp_path, changes):
    return graph_tool.problems(_plant(tmp_path, {**BASE, **changes}))


def test_a_clean_planted_tree_passes(tmp_path):
    assert _problems_with(tmp_path, {}) == []


def test_a_planted_cycle_fails_naming_the_modules(tmp_path):
    found = _problems_with(tmp_path, {
        "kernels/cuda/__init__.py": "",
        "kernels/cuda/im2col.py": "from .. import im2col as cpu\n",
        "kernels/im2col.py": "def f():\n    from .cuda.im2col import g  # inside a function: counts too\n"})
    assert found == ["import cycle of 2 modules: layerforge.kernels.cuda.im2col -> layerforge.kernels.im2col"
                     " -> layerforge.kernels.cuda.im2col"]


def test_a_planted_upward_import_fails_naming_both_modules(tmp_path):
    found = _problems_with(tmp_path, {"kernels/im2col.py": "def f():\n    from ..layers.conv import Convolution\n"})
    assert "layerforge.kernels.im2col (line 2) imports layerforge.layers.conv: up from kernels and collectives " \
           "to layers" in found
    assert any(line.startswith("import cycle of") for line in found)  # conv imports im2col: a circle as well


def test_an_import_across_rooms_of_one_level_fails(tmp_path):
    found = _problems_with(tmp_path, {"comm/__init__.py": "", "comm/ring.py": "from ..kernels import im2col\n"})
    assert found == ["layerforge.comm.ring (line 1) imports layerforge.kernels.im2col: across rooms of the level "
                     "kernels and collectives"]


def test_a_room_on_no_level_fails(tmp_path):
    assert _problems_with(tmp_path, {"gadgets/__init__.py": ""}) == [
        "layerforge.gadgets: not placed on a level of tools/import_graph.py LEVELS"]


@pytest.mark.parametrize("statement, target", [
    ("import layerforge.kernels.im2col", "layerforge.kernels.im2col"),
    ("from layerforge.kernels.im2col import im2col", "layerforge.kernels.im2col"),
    ("from layerforge.kernels import im2col", "layerforge.kernels.im2col"),
    ("from ..kernels import im2col as i", "layerforge.kernels.im2col"),
    ("from .. import blob", "layerforge.blob"),
    ("import numpy", None),
])
def test_each_form_of_import_is_resolved(tmp_path, statement, target):
    graph = graph_tool.import_graph(_plant(tmp_path, {**BASE, "layers/conv.py": statement + "\n"}))
    assert sorted(graph["layerforge.layers.conv"]) == ([target] if target else [])
