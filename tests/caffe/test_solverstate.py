"""Snapshots in Caffe's formats: snapshot_format BINARYPROTO / HDF5 write and restore (layerforge.caffe.solverstate)."""
import os

import h5py
import numpy
import pytest

from layerforge.caffe import caffe_pb
from layerforge.caffe.caffemodel import blob_to_array
from layerforge.caffe.solverstate import current_step
from layerforge.errors import LayerforgeError
from layerforge.solvers import get_solver

NET = {"name": "tiny", "layers": [
    {"name": "data", "type": "DummyData", "top": ["x", "t"],
     "dummy_data": {"shape": [[4, 3], [4, 2]], "data_filler": [{"type": "gaussian"}]}},
    {"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "y",
     "inner_product": {"num_output": 2, "weight_filler": {"type": "gaussian"}}},
    {"name": "loss", "type": "EuclideanLoss", "bottom": ["y", "t"], "top": "loss"},
]}


def solver(tmp_path, fmt, kind="Adam", **extra):
    return get_solver(dict(net_param=NET, type=kind, base_lr=0.1, momentum=0.9, max_iter=3, snapshot_format=fmt,
                           snapshot_prefix=str(tmp_path / "snap"), random_seed=1, **extra))


@pytest.mark.parametrize("kind, per_param", [("SGD", 1), ("Adam", 2)])
def test_binaryproto_snapshot_is_caffes_layout(tmp_path, kind, per_param):
    s = solver(tmp_path, "BINARYPROTO", kind)
    s.step(3)
    state = s.snapshot()
    assert state == str(tmp_path / "snap_iter_3.solverstate")
    assert os.path.exists(tmp_path / "snap_iter_3.caffemodel")
    message = caffe_pb.SolverState.FromString(open(state, "rb").read())
    assert message.iter == 3 and message.learned_net == str(tmp_path / "snap_iter_3.caffemodel")
    assert message.current_step == 0 and len(message.history) == 2 * per_param  # ip weight and bias
    # Caffe's order: history[k * n + i] is state k of parameter i
    assert [list(h.shape.dim) for h in message.history] == [[2, 3], [2]] * per_param
    for h, mine in zip(message.history, s.history):
        numpy.testing.assert_array_equal(blob_to_array(h), mine)
    weights = caffe_pb.NetParameter.FromString((tmp_path / "snap_iter_3.caffemodel").read_bytes())
    numpy.testing.assert_array_equal(blob_to_array(weights.layer[1].blobs[0]), s.net.params["ip"][0].data)


@pytest.mark.parametrize("fmt", ["BINARYPROTO", "HDF5"])
def test_restore_continues_as_an_uninterrupted_run(tmp_path, fmt):
    straight = solver(tmp_path / "a", fmt)
    straight.step(3)
    first = solver(tmp_path, fmt)
    first.step(2)
    state = first.snapshot()
    resumed = solver(tmp_path / "b", fmt)
    resumed.restore(state)
    assert resumed.iter == 2
    for h, mine in zip(resumed.history, first.history):
        numpy.testing.assert_array_equal(h, mine)
    numpy.testing.assert_array_equal(resumed.net.params["ip"][0].data, first.net.params["ip"][0].data)
    # the data are DummyData draws from the random stream, which Caffe's formats do not keep: one more
    # step from the same weights and history on the same batch gives the same update
    from layerforge import rng
    rng.seed(7)
    first.step(1)
    rng.seed(7)
    resumed.step(1)
    numpy.testing.assert_array_equal(resumed.net.params["ip"][0].data, first.net.params["ip"][0].data)


def test_hdf5_snapshot_layout(tmp_path):
    s = solver(tmp_path, "HDF5", "SGD", lr_policy="multistep", gamma=0.1, stepvalue=[1, 2, 10])
    s.step(3)
    state = s.snapshot()
    assert state == str(tmp_path / "snap_iter_3.solverstate.h5")
    with h5py.File(state, "r") as h5:
        assert sorted(h5) == ["current_step", "history", "iter", "learned_net"]
        assert h5["iter"][()].tolist() == [3] and h5["current_step"][()].tolist() == [2]
        assert h5["learned_net"][()] == str(tmp_path / "snap_iter_3.caffemodel.h5").encode()
        numpy.testing.assert_array_equal(h5["history/0"][()], s.history[0])
    with h5py.File(tmp_path / "snap_iter_3.caffemodel.h5", "r") as h5:
        numpy.testing.assert_array_equal(h5["data/ip/0"][()], s.net.params["ip"][0].data)
        assert list(h5["data/loss"]) == []


def test_learned_net_is_found_beside_a_moved_state(tmp_path):
    s = solver(tmp_path / "run", "BINARYPROTO")
    s.step(1)
    s.snapshot()
    os.rename(tmp_path / "run", tmp_path / "moved")
    other = solver(tmp_path, "BINARYPROTO")
    other.restore(str(tmp_path / "moved" / "snap_iter_1.solverstate"))
    numpy.testing.assert_array_equal(other.net.params["ip"][0].data, s.net.params["ip"][0].data)


def test_current_step_follows_caffe():
    class SP:
        lr_policy, stepsize, stepvalue = "STEP", 10, []
    assert [current_step(SP, it) for it in (0, 1, 10, 11, 25)] == [0, 0, 0, 1, 2]
    SP.lr_policy, SP.stepvalue = "MULTISTEP", [5, 8]
    assert [current_step(SP, it) for it in (5, 6, 9, 100)] == [0, 1, 2, 2]


def test_bad_states_are_one_line(tmp_path):
    s = solver(tmp_path, "BINARYPROTO", "SGD")
    path = tmp_path / "x.solverstate"
    path.write_bytes(b"\x0b\x0c garbage")
    with pytest.raises(LayerforgeError) as e:
        s.restore(str(path))
    assert str(e.value).startswith(f"{path}: not a Caffe solver state (.solverstate)")
    adam = solver(tmp_path, "BINARYPROTO", "Adam")
    adam.step(1)
    state = adam.snapshot()
    with pytest.raises(LayerforgeError, match="holds 4 history blobs but this SGD solver has 2"):
        s.restore(state)


def test_train_command_takes_caffe_weights_and_resumes_from_a_solverstate(tmp_path):
    import argparse

    import yaml

    from layerforge.caffe.caffemodel import save_caffemodel
    from layerforge.commands import train
    start = solver(tmp_path / "w", "BINARYPROTO")
    save_caffemodel(start.net, tmp_path / "start.caffemodel")
    (tmp_path / "solver.yaml").write_text(yaml.safe_dump(dict(
        net_param=NET, type="SGD", base_lr=0.1, max_iter=2, snapshot_format="BINARYPROTO",
        snapshot_prefix=str(tmp_path / "run"), random_seed=1)))
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    fine = get_solver(str(tmp_path / "solver.yaml"), weights=[str(tmp_path / "start.caffemodel")])
    numpy.testing.assert_array_equal(fine.net.params["ip"][0].data, start.net.params["ip"][0].data)
    assert train.run(parser.parse_args(["--solver", str(tmp_path / "solver.yaml"), "--no-progress",
                                        "--weights", str(tmp_path / "start.caffemodel")])) == 0
    assert os.path.exists(tmp_path / "run_iter_2.caffemodel") and os.path.exists(tmp_path / "run_iter_2.solverstate")
    (tmp_path / "solver.yaml").write_text((tmp_path / "solver.yaml").read_text().replace("max_iter: 2", "max_iter: 3"))
    assert train.run(parser.parse_args(["--solver", str(tmp_path / "solver.yaml"), "--no-progress",
                                        "--snapshot", str(tmp_path / "run_iter_2.solverstate")])) == 0
    state = caffe_pb.SolverState.FromString((tmp_path / "run_iter_3.solverstate").read_bytes())
    assert state.iter == 3 and state.learned_net == str(tmp_path / "run_iter_3.caffemodel")
