"""pycaffe's ``caffe.NCCL``: the gradient exchange of python/train.py, one process per GPU.

Each process sets its device, ``set_solver_count(n)`` and ``set_solver_rank(r)``, makes its solver, then
``nccl = caffe.NCCL(solver, uid)`` (``uid`` from ``NCCL.new_uid()`` in the parent), ``nccl.bcast()`` (rank 0's
weights everywhere) and ``solver.add_callback(nccl)``: after every backward the gradients are summed over the
processes and divided by n, as Caffe's NCCL<Dtype> does. With ``layer_wise_reduce`` (layerforge's
``allreduce_overlap``) and ``solver.net.after_backward(nccl)`` each layer's gradients go as soon as backward has
made them. The collectives are layerforge.comm.nccl's.
"""
from ..comm import nccl as comm_nccl
from ..errors import LayerforgeError
from . import mode


def has_nccl():
    """True when NCCL can be used here (cupy built with NCCL and a CUDA device)."""
    return comm_nccl.available()


class _Communicator:
    """What layerforge.comm.nccl reads of a communicator: its NCCL communicator, here made from pycaffe's uid."""

    def __init__(self, uid):
        from cupy.cuda import nccl

        self._nccl = nccl.NcclCommunicator(mode.solver_count(), comm_nccl.communicator_id(uid), mode.solver_rank())


class NCCL:
    """``NCCL(solver, uid)``: this process's member of the NCCL clique ``uid`` of ``caffe.solver_count()`` solvers."""

    @staticmethod
    def new_uid():
        """A new clique id (bytes), to hand to every process."""
        _require("caffe.NCCL.new_uid()")
        from cupy.cuda import nccl

        return comm_nccl.unique_id_bytes(nccl.get_unique_id())

    def __init__(self, solver, uid):
        _require("caffe.NCCL(solver, uid)")
        if solver.solver.xp.__name__ != "cupy":
            raise LayerforgeError("caffe.NCCL(solver, uid) exchanges device arrays: call caffe.set_mode_gpu() "
                                  "before making the solver")
        mode.set_multiprocess(True)
        self.solver = solver
        self._comm = _Communicator(uid)

    def _params(self):
        return self.solver.solver.net.learnable_params

    def bcast(self):
        """Give every process rank 0's parameters (Caffe's NCCL::Broadcast)."""
        for blob in self._params():
            comm_nccl.broadcast_nccl(self._comm, blob.data)

    def _average(self, blobs):
        for blob in blobs:
            comm_nccl.allreduce_nccl(self._comm, blob.diff)
            diff = blob.diff
            diff *= 1.0 / mode.solver_count()

    # Solver callback (solver.add_callback(nccl)) --------------------------------------------------------------
    def on_start(self):
        pass

    def on_gradients_ready(self):
        """Average all gradients over the processes, unless the net's after_backward already sent them layer by
        layer (layer_wise_reduce)."""
        if not self.solver.param.layer_wise_reduce:
            self._average(self._params())

    # Net callback (solver.net.after_backward(nccl)) -----------------------------------------------------------
    def run(self, layer):
        """Average layer ``layer``'s gradients as soon as its backward has made them."""
        if not self.solver.param.layer_wise_reduce:
            raise LayerforgeError("caffe.NCCL as an after_backward callback needs layer_wise_reduce: true")
        self._average(self.solver.solver.net.layers[layer].blobs)


def _require(what):
    if not has_nccl():
        raise LayerforgeError(f"{what}: NCCL is not available (needs cupy with NCCL and a CUDA device); check "
                              "caffe.has_nccl() first, or train on several devices with `layerforge train "
                              "--devices 0,1,...` (docs/distributed.md)")
