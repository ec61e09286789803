"""tools/caffe: Caffe's tool command line (gflags' -flag, --flag, -flag=value) run by layerforge, as the shell
scripts that Caffe's examples and the SSD fork's ssd_pascal.py write call ./build/tools/caffe."""
import re
import subprocess
import sys

import pytest
import yaml

from layerforge.cli import from_caffe_argv
from tests.test_cli import ROOT


def caffe(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "caffe"), *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("argv, want", [
    (["train", "--solver=models/solver.prototxt", "--weights=vgg.caffemodel", "--gpu", "0,1,2,3"],
     ["train", "--solver", "models/solver.prototxt", "--weights", "vgg.caffemodel", "--gpu", "0,1,2,3"]),
    (["train", "-solver", "s.prototxt", "-snapshot", "s_iter_100.solverstate", "-sigint_effect", "snapshot"],
     ["train", "--solver", "s.prototxt", "--snapshot", "s_iter_100.solverstate", "--sigint-effect", "snapshot"]),
    (["test", "-model", "m.prototxt", "-weights", "w.caffemodel", "-iterations=100", "-phase", "TRAIN"],
     ["test", "--model", "m.prototxt", "--weights", "w.caffemodel", "--iterations", "100", "--phase", "train"]),
    (["time", "-model=m.prototxt", "-phase=TEST", "-gpu", "0"], ["time", "--model", "m.prototxt", "--phase", "test",
                                                                  "--gpu", "0"]),
])
def test_caffes_flags_become_layerforges(argv, want):
    assert from_caffe_argv(argv) == want


def test_train_test_and_device_query_as_caffe_runs_them(tmp_path):
    solver = yaml.safe_load((ROOT / "configs" / "lenet_solver.yaml").read_text())
    solver.update(net=str(ROOT / "configs" / "lenet.yaml"), max_iter=2, test_interval=0, display=1,
                  snapshot_prefix=str(tmp_path / "lenet"), solver_mode="CPU")
    (tmp_path / "solver.yaml").write_text(yaml.safe_dump(solver))
    trained = caffe("train", "-solver", tmp_path / "solver.yaml", "-sighup_effect", "none")
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "Optimization Done." in trained.stderr
    weights = tmp_path / "lenet_iter_2.npz"
    tested = caffe("test", f"-model={ROOT / 'configs' / 'lenet.yaml'}", "-weights", weights, "-iterations", 2,
                   "-phase", "TEST", "-gpu", 0)
    assert tested.returncode == 0, tested.stderr[-2000:]
    assert len(re.findall(r"Batch \d, accuracy = ", tested.stderr)) == 2
    queried = caffe("device_query", "-gpu", 0)  # the emulated device where there is no GPU
    assert queried.returncode == 0, queried.stderr
    assert re.search(r"Device id: +0", queried.stderr) and re.search(r"Number of multiprocessors: +\d+",
                                                                     queried.stderr)


def test_a_command_caffe_has_but_this_tool_does_not_is_one_line():
    done = caffe("foo", "-model", "m")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: caffe foo: commands are train, test, time, device_query (usage: caffe " \
                                  "<command> -flag value ...)"
