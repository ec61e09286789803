"""Solver YAML errors: one line with file:line, key and a suggestion, as for net YAML."""
import pytest

from layerforge.errors import ConfigError
from layerforge.solvers import get_solver

NET = """
layers:
  - {name: data, type: Input, top: [x, y], input: {shape: [[2, 3], [2, 1]]}}
  - {name: ip, type: InnerProduct, bottom: [x], top: [ip], inner_product: {num_output: 1}}
  - {name: loss, type: EuclideanLoss, bottom: [ip, y], top: [loss]}
"""


def write(tmp_path, text):
    (tmp_path / "net.yaml").write_text(NET)
    path = tmp_path / "solver.yaml"
    path.write_text(text)
    return str(path)


def error_of(tmp_path, text, **overrides):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        get_solver(path, **overrides)
    return str(e.value), path


CASES = [
    ("net: net.yaml\nbase_lr: 0.1\nlr_polcy: step\n", 3, "key 'lr_polcy': unknown key; did you mean 'lr_policy'?"),
    ("net: net.yaml\nlr_policy: stepp\n", 2, "key 'lr_policy': expected one of FIXED, STEP"),
    ("net: net.yaml\nlr_policy: step\ngamma: 0.1\n", 2, "key 'lr_policy': lr_policy step needs 'stepsize'"),
    ("net: net.yaml\nlr_policy: multistep\ngamma: 0.1\nstepvalue: [10, 5]\n", 4,
     "key 'stepvalue': must be strictly increasing"),
    ("net: net.yaml\nlr_policy: poly\npower: 1\n", None, "lr_policy poly needs max_iter > 0"),
    ("net: net.yaml\ntype: Adma\n", 2, "unknown solver type 'Adma'; expected one of SGD"),
    ("net: net.yaml\ntype: AdaGrad\nmomentum: 0.9\n", 3, "momentum cannot be used with AdaGrad"),
    ("net: net.yaml\nbase_lr: fast\n", 2, "key 'base_lr': expected a number, got str 'fast'"),
    ("net: net.yaml\niter_size: 0\n", 2, "key 'iter_size': must be >= 1"),
    ("net: net.yaml\nallreduce: rign\n", 2, "did you mean 'RING'?"),
    ("net: net.yaml\nsolver_mode: TPU\n", 2, "key 'solver_mode': expected one of CPU, GPU"),
    ("base_lr: 0.1\n", None, "give exactly one of net, net_param, train_net, train_net_param"),
    ("net: net.yaml\ntrain_net: net.yaml\n", 2, "give exactly one of net"),
    ("train_net: net.yaml\ntest_net: [net.yaml]\n", None, "test_iter has 0 entries for 1 test net(s)"),
    ("net: net.yaml\ntest_iter: [0]\n", 2, "key 'test_iter': must be >= 1"),
]


@pytest.mark.parametrize("text,line,message", CASES)
def test_solver_yaml_error(tmp_path, text, line, message):
    err, path = error_of(tmp_path, text)
    assert message in err
    assert err.startswith(f"{path}:{line}:" if line else f"{path}")
    assert "\n" not in err


def test_type_suggestion(tmp_path):
    err, _ = error_of(tmp_path, "net: net.yaml\ntype: adma\n")
    assert "did you mean 'Adam'?" in err


def test_override_is_validated(tmp_path):
    err, path = error_of(tmp_path, "net: net.yaml\n", max_iter=-1)
    assert err.startswith(f"{path}: key 'max_iter': must be >= 0")


def test_net_error_keeps_net_file_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("layers:\n  - {name: ip, type: InnerProdut}\n")
    path = write(tmp_path, "net: bad.yaml\n")
    with pytest.raises(ConfigError) as e:
        get_solver(path)
    assert str(e.value).startswith(f"{tmp_path / 'bad.yaml'}:2:") and "did you mean 'InnerProduct'" in str(e.value)


def test_paths_and_defaults(tmp_path, monkeypatch):
    path = write(tmp_path, "net: net.yaml\ntype: adam\ntest_iter: [2]\n")
    monkeypatch.chdir("/")
    solver = get_solver(path, max_iter=3)
    p = solver.param
    assert type(solver).__name__ == "AdamSolver" and p.type == "Adam"
    assert (p.max_iter, p.lr_policy, p.momentum2, p.delta, p.test_initialization, p.snapshot_after_train) == \
        (3, "FIXED", 0.999, 1e-8, True, True)
    assert len(solver.test_nets) == 1 and solver.test_nets[0].phase == "TEST"
    assert solver.snapshot_prefix == "solver"  # relative to the working directory, as in Caffe
