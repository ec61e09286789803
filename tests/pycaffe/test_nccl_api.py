"""caffe.NCCL's wiring (python/train.py's use of it) with the NCCL collectives replaced by a stand-in for two ranks
that hold the same gradients: the sum is twice each, so averaging leaves them as they are. The real collectives run
on a device (layerforge.comm.nccl); the end-to-end run of python/train.py needs one (or the emulated one)."""
import types

import numpy
import pytest

import layerforge.pycaffe as caffe
from layerforge.pycaffe import nccl as pycaffe_nccl

NET = """name: 'n'
layer { type: 'DummyData' name: 'data' top: 'data' top: 'label'
  dummy_data_param { shape { dim: 4 dim: 3 dim: 5 dim: 5 } shape { dim: 4 }
    data_filler { type: 'constant' value: 0.5 } data_filler { type: 'constant' value: 1 } } }
layer { type: 'Convolution' name: 'conv' bottom: 'data' top: 'conv'
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: 'gaussian' std: 0.1 } } }
layer { type: 'InnerProduct' name: 'ip' bottom: 'conv' top: 'ip'
  inner_product_param { num_output: 3 weight_filler { type: 'gaussian' std: 0.1 } } }
layer { type: 'SoftmaxWithLoss' name: 'loss' bottom: 'ip' bottom: 'label' top: 'loss' }
"""


@pytest.fixture
def two_ranks(monkeypatch):
    calls = {"allreduce": 0, "bcast": 0}

    def allreduce(comm, buf):
        calls["allreduce"] += 1
        buf *= 2  # rank 0's and rank 1's equal gradients, summed

    def broadcast(comm, buf):
        calls["bcast"] += 1
        buf[...] = 0.25  # rank 0's weights

    monkeypatch.setattr(pycaffe_nccl, "has_nccl", lambda: True)
    monkeypatch.setattr(pycaffe_nccl, "_Communicator", lambda uid: object())
    monkeypatch.setattr(pycaffe_nccl.comm_nccl, "allreduce_nccl", allreduce)
    monkeypatch.setattr(pycaffe_nccl.comm_nccl, "broadcast_nccl", broadcast)
    caffe.set_solver_count(2)
    yield calls
    caffe.set_solver_count(1)
    caffe.set_multiprocess(False)


def solver_file(tmp_path, layer_wise):
    (tmp_path / "net.prototxt").write_text(NET)
    path = tmp_path / "solver.prototxt"
    path.write_text(f"net: '{tmp_path / 'net.prototxt'}'\nbase_lr: 0.01\nmomentum: 0.9\nmax_iter: 3\n"
                    f"random_seed: 5\nlayer_wise_reduce: {str(layer_wise).lower()}\n")
    return str(path)


def on_device(solver):
    solver.solver.xp = types.SimpleNamespace(__name__="cupy")  # NCCL takes device arrays: stand in for them
    return solver


@pytest.mark.parametrize("layer_wise", [False, True])
def test_train_py_wiring_averages_gradients_and_broadcasts_weights(tmp_path, two_ranks, layer_wise):
    caffe.set_mode_cpu()
    reference = caffe.SGDSolver(solver_file(tmp_path, layer_wise))
    solver = on_device(caffe.SGDSolver(solver_file(tmp_path, layer_wise)))
    nccl = caffe.NCCL(solver, b"uid")
    assert caffe.multiprocess() is True
    nccl.bcast()
    assert all(numpy.all(p.data == 0.25) for p in solver.solver.net.learnable_params)
    for p, q in zip(reference.solver.net.learnable_params, solver.solver.net.learnable_params):
        p.data[...] = q.data
    solver.add_callback(nccl)  # as python/train.py does
    if solver.param.layer_wise_reduce:
        solver.net.after_backward(nccl)
    for s in (reference, solver):
        s.step(3)
    for p, q in zip(reference.solver.net.learnable_params, solver.solver.net.learnable_params):
        numpy.testing.assert_allclose(q.data, p.data, rtol=1e-6, atol=1e-7)
    layers_with_params = sum(1 for layer in solver.solver.net.layers if layer.blobs)
    per_iteration = layers_with_params * 2 if layer_wise else len(solver.solver.net.learnable_params)
    assert two_ranks["allreduce"] == 3 * per_iteration  # each parameter blob once an iteration (2 blobs a layer)


def test_nccl_needs_a_gpu_mode_solver(tmp_path, two_ranks):
    caffe.set_mode_cpu()
    with pytest.raises(caffe.LayerforgeError, match="set_mode_gpu"):
        caffe.NCCL(caffe.SGDSolver(solver_file(tmp_path, True)), b"uid")
