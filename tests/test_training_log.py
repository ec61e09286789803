import subprocess
import sys

import pytest

from layerforge.errors import LayerforgeError
from layerforge.training_log import parse_log
from tests.test_cli import ROOT

# lines as Caffe itself writes them (glog prefix), and as layerforge does
CAFFE_LOG = """\
I0101 10:00:00.000000  1234 solver.cpp:330] Iteration 0, Testing net (#0)
I0101 10:00:01.500000  1234 solver.cpp:397]     Test net output #0: accuracy = 0.1
I0101 10:00:01.500000  1234 solver.cpp:397]     Test net output #1: loss = 2.3 (* 1 = 2.3 loss)
I0101 10:00:02.000000  1234 solver.cpp:218] Iteration 0 (0 iter/s, 2s/100 iters), loss = 2.31
I0101 10:00:02.000000  1234 solver.cpp:237]     Train net output #0: loss = 2.31 (* 1 = 2.31 loss)
I0101 10:00:02.000000  1234 sgd_solver.cpp:105] Iteration 0, lr = 0.01
I0101 10:00:12.250000  1234 solver.cpp:218] Iteration 100 (9.75 iter/s, 10.25s/100 iters), loss = 0.25
I0101 10:00:12.250000  1234 solver.cpp:237]     Train net output #0: loss = 0.25 (* 1 = 0.25 loss)
I0101 10:00:12.250000  1234 sgd_solver.cpp:105] Iteration 100, lr = 0.0099
I0101 10:00:20.000000  1234 solver.cpp:330] Iteration 200, Testing net (#0)
I0101 10:00:21.000000  1234 solver.cpp:397]     Test net output #0: accuracy = 0.95
I0101 10:00:21.000000  1234 solver.cpp:397]     Test net output #1: loss = 0.16 (* 1 = 0.16 loss)
"""


def test_parse_caffe_log(tmp_path):
    path = tmp_path / "caffe.log"
    path.write_text(CAFFE_LOG)
    train, test = parse_log(path)
    assert train == [{"iteration": 0, "seconds": 2.0, "loss": 2.31, "lr": 0.01},
                     {"iteration": 100, "seconds": 12.25, "loss": 0.25, "lr": 0.0099}]
    assert test == [{"iteration": 0, "seconds": 1.5, "accuracy": 0.1, "loss": 2.3},
                    {"iteration": 200, "seconds": 21.0, "accuracy": 0.95, "loss": 0.16}]


def test_layerforge_rate_inside_caffes_brackets(tmp_path):
    path = tmp_path / "layerforge.log"
    path.write_text(CAFFE_LOG.replace("(9.75 iter/s, 10.25s/100 iters)", "(9.75 iter/s, 10.25s/100 iters, 624.0 img/s)")
                    .replace("(0 iter/s, 2s/100 iters)", "(0 iter/s, 2s/100 iters, 0.0 img/s)"))
    train, test = parse_log(path)
    assert train == [{"iteration": 0, "seconds": 2.0, "images_per_second": 0.0, "loss": 2.31, "lr": 0.01},
                     {"iteration": 100, "seconds": 12.25, "images_per_second": 624.0, "loss": 0.25, "lr": 0.0099}]
    assert len(test) == 2


def test_not_a_log(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("hello\n")
    with pytest.raises(LayerforgeError, match="not a Caffe-format training log"):
        parse_log(path)


@pytest.mark.parametrize("x", ["iteration", "seconds"])
def test_plot_tool_writes_png(tmp_path, x):
    log = tmp_path / "caffe.log"
    log.write_text(CAFFE_LOG)
    out = tmp_path / "plot.png"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "plot_training_log"), str(log), str(out), "--x", x],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{out}: 2 train points, 2 test points"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_layerforge_log_parses(tmp_path):
    solver = tmp_path / "solver.yaml"
    solver.write_text(f"net: {ROOT / 'configs' / 'lenet.yaml'}\nbase_lr: 0.01\nmomentum: 0.9\nmax_iter: 4\n"
                      f"display: 2\ntest_iter: 1\ntest_interval: 4\nsnapshot_after_train: false\n")
    proc = subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver", str(solver)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    log = tmp_path / "train.log"
    log.write_text(proc.stderr)
    train, test = parse_log(log)
    assert [r["iteration"] for r in train if "loss" in r] == [0, 2]
    assert [r["iteration"] for r in train if r.get("images_per_second", 0) > 0] == [2]  # 0 at iteration 0, as iter/s
    assert [r["iteration"] for r in test] == [0, 4]
    assert all(0 <= r["accuracy"] <= 1 for r in test)
