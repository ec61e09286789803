"""caffe.SGDSolver / get_solver as pycaffe's test_solver.py uses them."""
import numpy
import pytest

import layerforge.pycaffe as caffe

from .test_net import NUM_OUTPUT, simple_net_file

pytestmark = pytest.mark.usefixtures("caffe_mode")  # every test in CPU mode and in GPU mode


@pytest.fixture
def solver(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # snapshots land in the working directory, as Caffe's test expects
    net_file = simple_net_file(tmp_path)
    path = tmp_path / "solver"
    path.write_text(f"net: '{net_file}'\n"
                    "test_iter: 10 test_interval: 10 base_lr: 0.01 momentum: 0.9\n"
                    "weight_decay: 0.0005 lr_policy: 'inv' gamma: 0.0001 power: 0.75\n"
                    "display: 100 max_iter: 100 snapshot_after_train: false\n"
                    "snapshot_prefix: \"model\"")
    solver = caffe.SGDSolver(str(path))
    assert isinstance(caffe.get_solver(str(path)), caffe.Solver)
    caffe.set_mode_cpu()
    rs = numpy.random.RandomState(0)
    for net in [solver.net] + solver.test_nets:
        net.blobs["label"].data[...] = rs.randint(NUM_OUTPUT, size=net.blobs["label"].data.shape)
    return solver


def test_solve_runs_to_max_iter(solver):
    assert solver.iter == 0
    solver.solve()
    assert solver.iter == 100


def test_apply_update_is_one_sgd_step(solver):
    net = solver.net
    data = net.layers[1].blobs[0].data
    data[...] = 0
    net.layers[1].blobs[0].diff[...] = 1
    solver.apply_update()
    # base_lr 0.01, weight decay 0.0005 on zero weights adds nothing, no momentum history yet (on a GPU a kept array
    # shows the device's values once its blob is read again, as Caffe's)
    numpy.testing.assert_allclose(net.layers[1].blobs[0].data, -0.01, atol=1e-7)
    numpy.testing.assert_allclose(data, -0.01, atol=1e-7)
    assert solver.iter == 0  # Caffe's ApplyUpdate does not count an iteration


def test_nets_outlive_the_solver(solver):
    nets = [solver.net] + list(solver.test_nets)
    assert len(nets) == 2
    del solver
    assert all(numpy.isfinite(float(p.data.sum())) for net in nets for ps in net.params.values() for p in ps)


def test_test_net_shares_the_train_weights(solver):
    solver.net.params["ip"][0].data[...] = 0.25
    numpy.testing.assert_array_equal(solver.test_nets[0].params["ip"][0].data, 0.25)


def test_snapshot_writes_caffes_files(solver, tmp_path):
    # a Caffe solver file without snapshot_format gets Caffe's default, BINARYPROTO
    solver.snapshot()
    assert sorted(p.name for p in tmp_path.glob("model_iter_0*")) == ["model_iter_0.caffemodel",
                                                                      "model_iter_0.solverstate"]
    from layerforge.caffe import caffe_pb

    state = caffe_pb.SolverState()
    state.ParseFromString((tmp_path / "model_iter_0.solverstate").read_bytes())
    assert state.iter == 0 and state.learned_net.endswith("model_iter_0.caffemodel")


@pytest.mark.parametrize("cls,type_name", [(caffe.SGDSolver, "SGD"), (caffe.NesterovSolver, "Nesterov"),
                                           (caffe.AdaGradSolver, "AdaGrad"), (caffe.RMSPropSolver, "RMSProp"),
                                           (caffe.AdaDeltaSolver, "AdaDelta"), (caffe.AdamSolver, "Adam")])
def test_solver_classes_force_their_rule(tmp_path, cls, type_name):
    path = tmp_path / "solver"
    path.write_text(f"net: '{simple_net_file(tmp_path)}'\nbase_lr: 0.01 max_iter: 1 snapshot_after_train: false "
                    f"type: 'SGD'")
    assert type(cls(str(path)).solver).__name__.startswith(type_name)
