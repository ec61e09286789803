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


def test_a_command_imported_outside_the_command_line_fails(tmp_path):
    commands = {"commands/__init__.py": "", "commands/draw.py": "def run(args):\n    pass\n",
                "cli.py": "from .commands import draw\n"}  # the command line's table: allowed
    assert _problems_with(tmp_path, commands) == []
    found = _problems_with(tmp_path, {**commands, "pycaffe/__init__.py": "",
                                      "pycaffe/draw.py": "def f():\n    from ..commands.draw import run\n"})
    assert found == ["layerforge.pycaffe.draw (line 2) imports layerforge.commands.draw: a command is imported by "
                     "the command line only; move what it shares below commands/"]


SOLVER_ROOM = {"solvers/__init__.py": "", "solvers/solver.py": "class Solver:\n    def __init__(self):\n"
               "        self.root = True\n        self.callbacks = []\n", "dataparallel/__init__.py": ""}


@pytest.mark.parametrize("body, changed", [
    ("def attach(solver, comm):\n    solver.root = comm.rank == 0\n", "solver.root"),
    ("class Sync:\n    def hook(self):\n        self.solver.skip_update = True\n", "self.solver.skip_update"),
    ("def attach(solver, fn):\n    solver.callbacks.insert(0, fn)\n", "solver.callbacks"),
    ("def attach(solver):\n    setattr(solver, 'root', False)\n", "solver"),
    ("def attach(worker_solver, h):\n    worker_solver.history[0] = h\n", "worker_solver.history"),
    ("from ..solvers import get_solver\n\ndef run(path):\n    s = get_solver(path)\n    s.iter += 3\n", "s.iter"),
])
def test_a_solver_changed_outside_solvers_fails(tmp_path, body, changed):
    found = _problems_with(tmp_path, {**SOLVER_ROOM, "dataparallel/mpi.py": body})
    assert len(found) == 1
    assert found[0].startswith("layerforge.dataparallel.mpi (line ") and found[0].endswith(
        f" changes {changed}: a Solver is changed by solvers/ only; data parallelism acts through its seam "
        "(Solver.add_seam)")


def test_the_solver_s_own_room_and_what_it_offers_pass(tmp_path):
    # solvers/ sets its own attributes; others call the solver's methods and change its net, not the solver
    allowed = ("def attach(solver, seam, f):\n    solver.add_seam(seam)\n    solver.add_callback(f)\n"
               "    solver.net.backward = f\n    solver.net.backward_hooks.append(f)\n    sp = solver.param\n")
    assert _problems_with(tmp_path, {**SOLVER_ROOM, "dataparallel/mpi.py": allowed}) == []


@pytest.mark.parametrize("definition, name", [
    ("ENGINE_CHOICES = {'AUTO': ('IM2COL', 'IMPLICIT')}\n", "ENGINE_CHOICES"),
    ("class AutoChoice:\n    pass\n", "AutoChoice"),
    ("def settle_engines(net, one_pass):\n    pass\n", "settle_engines"),
])
def test_engine_selection_in_a_layer_module_fails(tmp_path, definition, name):
    source = BASE["layers/conv.py"] + definition
    found = _problems_with(tmp_path, {"layers/conv.py": source})
    assert found == [f"layerforge.layers.conv (line 3) defines {name}: engine selection belongs in "
                     "kernels/autotune.py"]


def test_a_layer_may_use_the_engine_selection(tmp_path):
    uses = BASE["layers/conv.py"] + ("from ..kernels.im2col import ENGINE_CHOICES\n\n\nclass Convolution:\n"
                                     "    def _choose_engines(self):\n        return ENGINE_CHOICES\n")
    assert _problems_with(tmp_path, {"layers/conv.py": uses}) == []


@pytest.mark.parametrize("statement, name", [
    ("from ..backend import Stopwatch\n", "backend.Stopwatch"),
    ("import time\n", "time"),
    ("def f():\n    from time import perf_counter\n", "time.perf_counter"),
    ("from ..kernels import engine_cache\n", "kernels.engine_cache"),
    ("from ..kernels.engine_cache import lookup\n", "kernels.engine_cache.lookup"),
    ("from ..kernels.autotune import AutoChoice\n", "kernels.autotune.AutoChoice"),
])
def test_a_layer_module_that_times_code_or_reads_the_engine_cache_fails(tmp_path, statement, name):
    line = 3 + statement.count("\n") - 1
    found = _problems_with(tmp_path, {"layers/conv.py": BASE["layers/conv.py"] + statement,
                                      "kernels/engine_cache.py": "", "kernels/autotune.py": "", "backend.py": ""})
    assert found == [f"layerforge.layers.conv (line {line}) imports {name}: a layer neither times code nor reads "
                     "the engine cache; its ConvEngines (kernels/autotune.py) does"]


def test_a_layer_may_hold_conv_engines(tmp_path):
    uses = BASE["layers/conv.py"] + ("from ..kernels.autotune import ConvEngines\nimport timeit\n\n\n"
                                     "class Convolution:\n    def forward(self, x):\n"
                                     "        return self.engines.run('forward', x)\n")
    assert _problems_with(tmp_path, {"layers/conv.py": uses, "kernels/autotune.py": ""}) == []


DOOR = ("import os\n\n\ndef requested():\n    return os.environ.get('LAYERFORGE_EMULATED_GPU', '') not in ('', '0')\n"
        "\n\ndef install_if_requested():\n    if requested():\n        from layerforge_emulator import install\n\n"
        "        install.install()\n")
EMULATOR = {"__init__.py": "", "install.py": "from . import raw\n",
            "raw.py": "from .install import x\n\n\ndef load(path):\n"
                      "    return open(path).read()  # a .cu file by path: not an import\n"}


def _emulator_problems(tmp_path, product, emulator):
    root = _plant(tmp_path, {**BASE, "emulated_gpu.py": DOOR, **product})
    for path, text in {**EMULATOR, **emulator}.items():
        (tmp_path / "layerforge_emulator" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "layerforge_emulator" / path).write_text(textwrap.dedent(text))
    return graph_tool.problems(root)


@pytest.mark.parametrize("product, emulator, expected", [
    ({}, {}, None),
    ({}, {"cublas.py": "def f(x):\n    from layerforge.kernels.blas import round_to_bfloat16\n"},
     "layerforge_emulator.cublas (line 2) imports layerforge.kernels.blas: the emulated device imports nothing of "
     "layerforge's (it gets the .cu text through cupy.RawModule)"),
    ({}, {"kernel_runner.py": "import importlib\nCACHE = importlib.import_module('layerforge.kernels.engine_cache')\n"},
     "layerforge_emulator.kernel_runner (line 2) imports layerforge.kernels.engine_cache: the emulated device imports "
     "nothing of layerforge's (it gets the .cu text through cupy.RawModule)"),
    ({"kernels/im2col.py": "def f():\n    from layerforge_emulator import install\n"}, {},
     "layerforge.kernels.im2col (line 2) imports layerforge_emulator: layerforge enters the emulated device only "
     "through layerforge.emulated_gpu.install_if_requested (LAYERFORGE_EMULATED_GPU)"),
    ({"emulated_gpu.py": DOOR.replace("    if requested():\n        from layerforge_emulator import install\n",
                                      "    import layerforge_emulator.install as install\n    if requested():\n")},
     {}, "layerforge.emulated_gpu (line 9) imports layerforge_emulator: layerforge enters the emulated device only "
         "through layerforge.emulated_gpu.install_if_requested (LAYERFORGE_EMULATED_GPU)"),
    ({"emulated_gpu.py": DOOR + "\n\ndef installed():\n    if True:\n        import layerforge_emulator\n"}, {},
     "layerforge.emulated_gpu (line 17) imports layerforge_emulator: layerforge enters the emulated device only "
     "through layerforge.emulated_gpu.install_if_requested (LAYERFORGE_EMULATED_GPU)"),
], ids=["apart", "emulator-imports-blas", "emulator-import_module-engine_cache", "kernels-import-it",
        "door-imports-before-the-check", "second-door"])
def test_the_emulator_and_layerforge_meet_only_at_the_door(tmp_path, product, emulator, expected):
    # the emulated device is a room beside the product: it imports none of layerforge, and layerforge imports it
    # only in emulated_gpu.install_if_requested, under the check of LAYERFORGE_EMULATED_GPU
    assert _emulator_problems(tmp_path, product, emulator) == ([expected] if expected else [])


def test_the_real_emulator_stands_apart_and_the_picture_shows_its_door():
    assert graph_tool.emulator_imports() == []
    assert "  emulated_gpu -.-> emulator" in graph_tool.picture().splitlines()
    from layerforge import emulated_gpu
    from layerforge_emulator import install
    assert emulated_gpu.ENV == install.ENV == "LAYERFORGE_EMULATED_GPU"


NET_ROOM = {"dataparallel/__init__.py": "", "pycaffe/__init__.py": ""}
NET_RULE = (" a Net, a layer and a blob's arrays are changed by net/, layers/, solvers/ and blob.py only; data "
            "parallelism acts through the Net's seam (Net.add_hooks, Net.set_batch_group, blob.pack_diffs)")


@pytest.mark.parametrize("body, changed", [
    ("def time(solver, timed):\n    solver.net.forward = timed\n", "solver.net.forward"),
    ("class Chunked:\n    def __init__(self, net):\n        net.backward = self.backward\n", "net.backward"),
    ("def share(net, group):\n    for layer in net.layers:\n        layer.batch_group = group\n", "layer.batch_group"),
    ("def share(net, group):\n    net.layers[3].batch_group = group\n", "net.layers[3].batch_group"),
    ("def attach(params, flat):\n    for p in params:\n        p.diff = flat\n", "p.diff"),
    ("def attach(params, flat):\n    for p in params:\n        p.data = flat\n", "p.data"),
    ("def scale(blob):\n    blob.diff *= 0.5\n", "blob.diff"),
    ("def feed(net, x):\n    net.blobs['data'].data = x\n", "net.blobs['data'].data"),
    ("def hook(net, f):\n    net.backward_hooks.append(f)\n", "net.backward_hooks"),
    ("def hook(test_net, f):\n    setattr(test_net, 'forward', f)\n", "test_net"),
    ("def swap(layer, b):\n    layer.blobs[0] = b\n", "layer.blobs"),
])
def test_a_net_or_layer_changed_outside_its_rooms_fails(tmp_path, body, changed):
    root = _plant(tmp_path, {**BASE, **NET_ROOM, "dataparallel/sync.py": body})
    found = graph_tool.net_assignments(root)
    assert len(found) == 1
    assert found[0].startswith("layerforge.dataparallel.sync (line ") and found[0].endswith(f" changes {changed}:" + NET_RULE)


def test_the_net_s_seam_and_its_own_rooms_pass(tmp_path):
    uses = ("from ..blob import pack_diffs\n\n\ndef attach(net, solver, group, slot, offsets, f, datum, x):\n"
            "    net.add_hooks(after_backward=f, passes=f)\n    net.set_batch_group(group, ('BatchNorm',))\n"
            "    pack_diffs(net.learnable_params, slot, offsets)\n    net.blobs['data'].data[...] = x\n"
            "    for p in net.learnable_params:\n        p.diff[...] = 0\n    datum.data = b''\n"
            "    solver.net.forward()\n    layer = caffe_pb.LayerParameter()\n    layer.name = 'conv'\n"
            "    self_made = x\n    self_made.data = x\n")
    changes = "def f(net, layer, p, x):\n    net.forward = x\n    layer.batch_group = x\n    p.diff = x\n"
    root = _plant(tmp_path, {**BASE, **NET_ROOM, "dataparallel/sync.py": uses, "net/fusion.py": changes,
                             "layers/batch_norm.py": changes, "solvers/__init__.py": "", "solvers/solver.py": changes,
                             "blob.py": changes})
    assert graph_tool.net_assignments(root) == []


def test_nothing_outside_the_net_s_rooms_changes_a_net():
    assert graph_tool.net_assignments() == []


ENTRANCE_ROOM = {"commands/__init__.py": "", "commands/train.py": "def run(args):\n    from ..dataparallel.runners import "
                 "runner_for\n    return runner_for(args)(args)\n", "solvers/__init__.py": "",
                 "dataparallel/__init__.py": "", "dataparallel/runners.py": "def runner_for(args):\n    pass\n",
                 "cli.py": "from .commands import train\n"}


@pytest.mark.parametrize("path, body, problem", [
    ("commands/time.py", "def run(args):\n    from ..dataparallel.runners import runner_for\n",
     "layerforge.commands.time (line 2) imports layerforge.dataparallel.runners: only layerforge.commands.train "
     "enters training (it picks the runner)"),
    ("pycaffe/__init__.py", "from ..dataparallel import runners\n",
     "layerforge.pycaffe (line 1) imports layerforge.dataparallel.runners: only layerforge.commands.train enters "
     "training (it picks the runner)"),
    ("commands/train.py", "def run(args, solver):\n    if args.plain:\n        return solver.solve()\n",
     "layerforge.commands.train (line 3) calls solve: the entrance trains through the runner it picks "
     "(layerforge.dataparallel.runners)"),
    ("commands/train.py", "from ..dataparallel.cgdp import train_parallel\n\n\ndef run(args):\n"
     "    return train_parallel(args.solver, workers=2)\n",
     "layerforge.commands.train (line 5) calls train_parallel: the entrance trains through the runner it picks "
     "(layerforge.dataparallel.runners)"),
])
def test_training_has_one_entrance(tmp_path, path, body, problem):
    assert _problems_with(tmp_path, ENTRANCE_ROOM) == []
    found = _problems_with(tmp_path, {**ENTRANCE_ROOM, "pycaffe/__init__.py": "", "dataparallel/cgdp/__init__.py":
                                      "def train_parallel(source, workers):\n    pass\n", path: body})
    assert found == [problem]
