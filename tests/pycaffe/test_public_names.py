"""Every public name of Caffe's pycaffe exists in layerforge.pycaffe, with Caffe's behaviour.

PYCAFFE_NAMES is transcribed from BVLC/caffe master (commit 9b89154): python/caffe/__init__.py, the
BOOST_PYTHON_MODULE(_caffe) definition in python/caffe/_caffe.cpp (module functions and each class's
.def / .add_property names; the GPU-build-only Blob._gpu_data_ptr/_gpu_diff_ptr and the boost vector wrappers
BlobVec, RawBlobVec, LayerVec, StringVec, IntVec, DtypeVec, NetVec, BoolVec left out: they are types, not API), and
python/caffe/pycaffe.py's properties and methods attached to Net, with the submodules ``import caffe`` brings and
the methods of caffe.Classifier / caffe.Detector (python/caffe/classifier.py, detector.py). 121 names.
"""
import logging

import numpy
import pytest

import layerforge.pycaffe as caffe

from .test_net import NUM_OUTPUT, simple_net_file

PYCAFFE_NAMES = {
    "caffe": ["Net", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver", "AdaDeltaSolver", "AdamSolver",
              "NCCL", "Timer", "init_log", "log", "set_mode_cpu", "set_mode_gpu", "set_device", "Layer", "get_solver",
              "layer_type_list", "set_random_seed", "solver_count", "set_solver_count", "solver_rank",
              "set_solver_rank", "set_multiprocess", "has_nccl", "__version__", "TRAIN", "TEST", "Classifier",
              "Detector", "io", "layers", "params", "NetSpec", "to_proto",
              "pycaffe", "proto", "net_spec", "classifier", "detector"],
    # _caffe.cpp's Net (less __init__) and pycaffe.py's additions
    "Net": ["_forward", "_backward", "reshape", "clear_param_diffs", "copy_from", "share_with", "_blob_loss_weights",
            "_bottom_ids", "_top_ids", "_blobs", "layers", "_blob_names", "_layer_names", "_inputs", "_outputs",
            "_set_input_arrays", "save", "save_hdf5", "load_hdf5", "before_forward", "after_forward",
            "before_backward", "after_backward",
            "blobs", "blob_loss_weights", "layer_dict", "params", "forward", "backward", "forward_all",
            "forward_backward_all", "set_input_arrays", "_batch", "inputs", "outputs", "top_names", "bottom_names"],
    "Blob": ["shape", "num", "channels", "height", "width", "count", "reshape", "data", "diff"],
    "Layer": ["blobs", "setup", "reshape", "type"],
    "BlobVec": ["add_blob"],  # a layer's blobs: Python layers make their parameters with it
    "SolverParameter": ["max_iter", "display", "layer_wise_reduce", "base_lr"],
    "Solver": ["net", "test_nets", "iter", "add_callback", "solve", "step", "restore", "snapshot", "share_weights",
               "apply_update", "param"],
    "SGDSolver": ["lr"],
    "NCCL": ["new_uid", "bcast"],
    "Timer": ["start", "stop", "ms"],
    "Classifier": ["predict"],
    "Detector": ["detect_windows", "detect_selective_search", "crop", "configure_crop"],
}


@pytest.fixture
def solver(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    caffe.set_mode_cpu()
    path = tmp_path / "solver.prototxt"
    path.write_text(f"net: '{simple_net_file(tmp_path)}'\nbase_lr: 0.01\nlr_policy: 'step' gamma: 0.5 stepsize: 2\n"
                    "max_iter: 10 display: 0 snapshot_after_train: false\n")
    return caffe.SGDSolver(str(path))


def instances(solver):
    net = solver.net
    from layerforge.layers.python_layer import BlobVec

    return {"caffe": caffe, "Net": net, "Blob": net.blobs["data"], "Layer": net.layers[1],
            "BlobVec": BlobVec(numpy.float32, numpy),
            "SolverParameter": solver.param, "Solver": solver, "SGDSolver": solver, "NCCL": caffe.NCCL,
            "Timer": caffe.Timer(), "Classifier": caffe.Classifier, "Detector": caffe.Detector}


@pytest.mark.parametrize("owner", sorted(PYCAFFE_NAMES))
def test_every_pycaffe_name_exists(solver, owner):
    obj = instances(solver)[owner]
    missing = [name for name in PYCAFFE_NAMES[owner] if not hasattr(obj, name)]
    assert not missing, f"{owner} lacks {missing}"


def test_import_caffe_names_are_pycaffes():
    assert caffe.TRAIN == 0 and caffe.TEST == 1 and caffe.__version__ == "1.0.0"
    assert issubclass(caffe.Classifier, caffe.Net) and issubclass(caffe.Detector, caffe.Net)


def test_timer_measures_between_start_and_stop_and_reading_stops_it(caplog):
    timer = caffe.Timer()
    with caplog.at_level(logging.WARNING, logger="layerforge"):
        assert timer.ms == 0.0
    assert "never been run" in caplog.text
    timer.start()
    a = numpy.ones((256, 256))
    for _ in range(10):
        a = a @ a / 256
    first = timer.ms  # reading a running timer stops it
    assert first > 0 and timer.ms == first
    timer.stop()
    assert timer.ms == first


def test_init_log_and_log_write_glog_lines(capfd):
    caffe.init_log()
    caffe.log("Using devices [0, 1]")
    err = capfd.readouterr().err
    assert err.startswith("I") and err.rstrip().endswith("] Using devices [0, 1]")
    caffe.init_log(2)  # ERROR and above only
    caffe.log("hidden")
    assert "hidden" not in capfd.readouterr().err
    caffe.init_log(0)


def test_solver_count_and_rank_make_a_shard_and_a_root(tmp_path, monkeypatch):
    try:
        assert (caffe.solver_count(), caffe.solver_rank()) == (1, 0)
        caffe.set_solver_count(2)
        caffe.set_solver_rank(1)
        caffe.set_multiprocess(True)
        assert (caffe.solver_count(), caffe.solver_rank(), caffe.multiprocess()) == (2, 1, True)
        monkeypatch.chdir(tmp_path)
        path = tmp_path / "solver.prototxt"
        path.write_text(f"net: '{simple_net_file(tmp_path)}'\nbase_lr: 0.01\nmax_iter: 1\n")
        solver = caffe.SGDSolver(str(path))
        assert solver.solver.root is False  # rank 1 of 2: no display, tests or snapshots
        assert solver.net.blobs["data"].num == 5  # DummyData's batch is not split: it reads no records
    finally:
        caffe.set_solver_count(1)
        caffe.set_solver_rank(0)
        caffe.set_multiprocess(False)


def test_add_callback_runs_on_start_then_on_gradients_ready_before_the_update(solver):
    events = []
    weights = solver.net.params["ip"][0].data
    solver.add_callback(lambda: events.append(("start", solver.iter)),
                        lambda: events.append(("ready", solver.iter, float(weights.sum()),
                                               float(numpy.abs(solver.net.params["ip"][0].diff).sum()) > 0)))
    before = float(weights.sum())
    solver.step(2)
    assert [e[:2] for e in events] == [("start", 0), ("ready", 0), ("start", 1), ("ready", 1)]
    assert events[1][2] == before and events[1][3]  # gradients there, weights not yet updated


def test_add_callback_takes_an_object_with_both_methods(solver):
    class Counter:
        starts = ready = 0

        def on_start(self):
            self.starts += 1

        def on_gradients_ready(self):
            self.ready += 1

    counter = Counter()
    solver.add_callback(counter)
    solver.step(3)
    assert (counter.starts, counter.ready) == (3, 3)


def test_lr_is_the_current_iterations_rate(solver):
    assert solver.lr == pytest.approx(0.01)
    solver.step(2)
    assert solver.lr == pytest.approx(0.005)  # step policy: gamma 0.5 every 2 iterations
    solver.param.base_lr = 0.1  # settable, as Caffe's SolverParameter.base_lr
    assert solver.lr == pytest.approx(0.05)


def test_share_weights_gives_a_net_the_solvers_parameters(solver, tmp_path):
    net = caffe.Net(simple_net_file(tmp_path, name="other"), caffe.TEST)
    solver.share_weights(net)
    solver.net.params["ip"][0].data[...] = 0.5
    numpy.testing.assert_array_equal(net.params["ip"][0].data, 0.5)


def test_layer_wise_reduce_is_read_from_the_file(tmp_path):
    path = tmp_path / "solver.prototxt"
    path.write_text(f"net: '{simple_net_file(tmp_path)}'\nbase_lr: 0.01\nlayer_wise_reduce: false\n")
    assert caffe.get_solver(str(path)).param.layer_wise_reduce is False
    path.write_text(f"net: '{simple_net_file(tmp_path)}'\nbase_lr: 0.01\n")
    param = caffe.get_solver(str(path)).param
    assert param.layer_wise_reduce is True and param.allreduce_overlap is True  # Caffe's default
    assert (param.max_iter, param.display) == (0, 0)


def test_net_callbacks_see_every_layer_in_order(solver):
    net, calls = solver.net, []
    for name in ("before_forward", "after_forward", "before_backward", "after_backward"):
        getattr(net, name)(lambda layer, name=name: calls.append((name, layer)))
    net.forward()
    n = len(net.layers)
    assert calls == [(kind, i) for i in range(n) for kind in ("before_forward", "after_forward")]
    calls.clear()
    net.backward()
    assert calls == [(kind, i) for i in reversed(range(n)) for kind in ("before_backward", "after_backward")]


def test_underscore_accessors_are_caffes(solver):
    net = solver.net
    names = net._blob_names
    assert names == list(net.blobs) and [b is net.blobs[n] for b, n in zip(net._blobs, names)] == [True] * len(names)
    assert net._blob_loss_weights == list(net.blob_loss_weights.values())
    assert [names[i] for i in net._inputs] == net.inputs and [names[i] for i in net._outputs] == net.outputs
    for i, layer in enumerate(net._layer_names):
        assert [names[j] for j in net._top_ids(i)] == net.top_names[layer]
        assert [names[j] for j in net._bottom_ids(i)] == net.bottom_names[layer]
    net.blobs["label"].data[...] = (numpy.arange(5) % NUM_OUTPUT).reshape(net.blobs["label"].data.shape)
    loss = net._forward(0, len(net.layers) - 1)  # ForwardFromTo returns the loss
    assert loss == pytest.approx(float(net.blobs["loss"].data))
    net._backward(len(net.layers) - 1, 0)
    assert numpy.abs(net.params["conv"][0].diff).sum() > 0


def test_blob_reshape_returns_none():
    from layerforge.blob import Blob

    blob = Blob((2, 3))
    assert blob.reshape(4, 5) is None and blob.shape == (4, 5)
    assert blob.reshape(4, 5) is None
