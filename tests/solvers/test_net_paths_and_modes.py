"""Where a solver's net files are read from, and who obeys ``solver_mode``.

Caffe reads a prototxt solver's ``net`` / ``train_net`` / ``test_net`` relative to the working directory (its 29
stock solvers say ``net: "examples/mnist/lenet_train_test.prototxt"`` and are run from the Caffe root); layerforge's
YAML solvers name their nets relative to themselves (docs/solvers.md). Only Caffe's command-line tool obeys
``solver_mode``; pycaffe follows ``caffe.set_mode_cpu()`` / ``set_mode_gpu()``.
"""
import logging
import subprocess
import sys

import pytest

import layerforge
import layerforge.pycaffe as caffe
from tests.test_cli import ROOT


def net_text(ip_name):
    """A tiny trainable net whose InnerProduct is called ``ip_name`` (which file was read shows in the layer names)."""
    return ("name: 'tiny'\n"
            "layer { name: 'data' type: 'DummyData' top: 'data' top: 'label'\n"
            "  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 }\n"
            "    data_filler { type: 'gaussian' } data_filler { type: 'constant' } } }\n"
            f"layer {{ name: '{ip_name}' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
            "  inner_product_param { num_output: 2 weight_filler { type: 'xavier' } } }\n"
            "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n")


SOLVER = ('net: "{net}"\nbase_lr: 0.01\nmax_iter: 2\ndisplay: 1\nsnapshot_after_train: false\n'
          'test_iter: 1\ntest_interval: 100\nsolver_mode: GPU\n')


@pytest.fixture
def caffe_root(tmp_path, monkeypatch):
    """A Caffe-root-like folder, the working directory: examples/mnist/ holds a solver naming its net from the root,
    and a decoy net at the same path taken relative to the solver's folder."""
    mnist = tmp_path / "examples" / "mnist"
    mnist.mkdir(parents=True)
    (mnist / "net.prototxt").write_text(net_text("from_root"))
    decoy = mnist / "examples" / "mnist"
    decoy.mkdir(parents=True)
    (decoy / "net.prototxt").write_text(net_text("beside_solver"))
    (mnist / "solver.prototxt").write_text(SOLVER.format(net="examples/mnist/net.prototxt"))
    monkeypatch.chdir(tmp_path)
    caffe.set_mode_cpu()
    return tmp_path


def layer_names(solver):
    return [layer.name for layer in solver.net.layers]


def test_a_caffe_solvers_nets_are_read_relative_to_the_working_directory(caffe_root):
    solver = caffe.SGDSolver("examples/mnist/solver.prototxt")
    assert "from_root" in layer_names(solver)
    assert "from_root" in [layer.name for layer in solver.test_nets[0].layers]
    assert "from_root" in layer_names(caffe.get_solver("examples/mnist/solver.prototxt"))


def test_a_parsed_caffe_solver_keeps_caffes_rule_when_checked_again_with_overrides(caffe_root):
    from layerforge.solvers.param import load_solver_param
    from layerforge.solvers.solver import SOLVER_REGISTRY

    parsed = load_solver_param("examples/mnist/solver.prototxt", SOLVER_REGISTRY, solver_mode="CPU")  # read once
    solver = layerforge.get_solver(parsed, max_iter=5)  # the command line's flow: the parameter, new overrides
    assert solver.param.max_iter == 5 and solver.param.caffe_paths
    assert "from_root" in layer_names(solver)


def test_a_caffe_solvers_net_found_only_beside_the_solver_is_used_and_said(caffe_root, monkeypatch, caplog):
    elsewhere = caffe_root / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with caplog.at_level(logging.WARNING, logger="layerforge"):
        solver = caffe.SGDSolver(str(caffe_root / "examples" / "mnist" / "solver.prototxt"))
    assert "beside_solver" in layer_names(solver)
    lines = [r.getMessage() for r in caplog.records if "beside the solver" in r.getMessage()]
    assert len(lines) == 1  # once, though the train and the test net both read it
    assert "'examples/mnist/net.prototxt'" in lines[0] and str(elsewhere) in lines[0]


def test_a_caffe_solvers_missing_net_names_the_path_it_was_given(caffe_root, monkeypatch):
    (caffe_root / "examples" / "mnist" / "solver.prototxt").write_text(SOLVER.format(net="nowhere/net.prototxt"))
    with pytest.raises(layerforge.LayerforgeError, match="nowhere/net.prototxt"):
        caffe.SGDSolver("examples/mnist/solver.prototxt")


def test_a_yaml_solvers_nets_stay_relative_to_the_solver_file(caffe_root):
    yaml_solver = caffe_root / "examples" / "mnist" / "solver.yaml"
    yaml_solver.write_text("net: examples/mnist/net.prototxt\nbase_lr: 0.01\nmax_iter: 1\n")
    assert "beside_solver" in layer_names(layerforge.get_solver(str(yaml_solver)))


@pytest.mark.parametrize("set_mode", ["never", "cpu"])
def test_pycaffe_ignores_the_files_solver_mode(caffe_root, set_mode):
    if set_mode == "cpu":
        caffe.set_mode_cpu()
    solver = caffe.SGDSolver("examples/mnist/solver.prototxt")  # the file says GPU; pycaffe's default is CPU
    assert solver.solver.xp.__name__ == "numpy" and solver.param.solver_mode == "CPU"
    solver.step(2)
    assert solver.iter == 2


def test_the_command_line_obeys_solver_mode_and_names_the_override(caffe_root, no_gpu):
    def train(*extra):
        return subprocess.run([sys.executable, "-m", "layerforge", "train", "--solver",
                               "examples/mnist/solver.prototxt", "--no-progress", *extra],
                              capture_output=True, text=True, cwd=caffe_root, timeout=120,
                              env=dict(__import__("os").environ, PYTHONPATH=str(ROOT)))

    refused = train()
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith("error: examples/mnist/solver.prototxt:8: key 'solver_mode': solver_mode GPU")
    assert lines[0].endswith("`layerforge train --cpu` (or solver_mode: CPU) trains on the CPU")
    trained = train("--cpu")
    assert trained.returncode == 0, trained.stderr
    assert "Optimization Done" in trained.stderr
