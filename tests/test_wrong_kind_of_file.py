"""A solver file given where a net is expected, and a net file given as a solver, are named as such in one line
with the flag that takes them (issue 51: the zoo's resnet50.yaml is the solver, resnet50_net.yaml the net)."""
import subprocess
import sys

import pytest

from layerforge import get_solver
from layerforge.errors import ConfigError
from layerforge.net import Net
from tests.test_cli import ROOT

SOLVER_AS_NET = ("error: configs/resnet50.yaml:8: a solver file (it has 'net', 'base_lr', 'lr_policy'), not a net: "
                 "give its net file configs/resnet50_net.yaml here (a solver goes to train --solver or plan --solver)")
NET_AS_SOLVER = ("error: configs/resnet50_net.yaml:41: a net file (it has 'layers', 'blocks'), not a solver: give a "
                 "solver file whose 'net' names it, such as configs/resnet50.yaml (a net goes to time --model or "
                 "test --model)")


def layerforge(*args):
    return subprocess.run([sys.executable, "-m", "layerforge", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


@pytest.mark.parametrize("args, expected", [
    (["time", "--model", "configs/resnet50.yaml"], SOLVER_AS_NET),
    (["summary", "configs/resnet50.yaml"], SOLVER_AS_NET),
    (["draw", "configs/resnet50.yaml"], SOLVER_AS_NET),
    (["train", "--solver", "configs/resnet50_net.yaml"], NET_AS_SOLVER),
])
def test_the_other_kind_of_zoo_file_is_one_line_naming_the_right_file_and_flag(args, expected):
    proc = layerforge(*args)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [expected], proc.stderr


def test_the_library_says_the_same(tmp_path):
    with pytest.raises(ConfigError, match=r"lenet_solver.yaml:6: a solver file .* give its net file \S*lenet.yaml"):
        Net(str(ROOT / "configs" / "lenet_solver.yaml"))
    with pytest.raises(ConfigError, match=r"lenet.yaml:4: a net file .* such as \S*lenet_solver.yaml \("):
        get_solver(str(ROOT / "configs" / "lenet.yaml"))
    inline = tmp_path / "inline.yaml"  # a solver with its net inline, and a net file no solver names
    inline.write_text("net_param: {name: n, layers: []}\nbase_lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"inline.yaml:1: a solver file \(it has 'net_param', 'base_lr'\), not a "
                                          r"net: give a net file here"):
        Net(str(inline))
    alone = tmp_path / "alone.yaml"
    alone.write_text("name: n\nlayers: []\n")
    with pytest.raises(ConfigError, match=r"alone.yaml:2: a net file \(it has 'layers'\), not a solver: give a "
                                          r"solver file whose 'net' names it \(a net"):
        get_solver(str(alone))
