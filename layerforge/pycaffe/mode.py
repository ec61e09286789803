"""pycaffe's global mode: CPU or GPU (and which device) for the nets and solvers made after it is set."""
import numpy

from .. import rng
from ..backend import gpu_array_module
from ..errors import LayerforgeError

_mode = {"gpu": False, "device": 0}


def set_mode_cpu():
    """Nets and solvers made from now on compute with numpy."""
    _mode["gpu"] = False


def set_mode_gpu():
    """Nets and solvers made from now on compute with cupy on the device of :func:`set_device`."""
    gpu_array_module(_mode["device"], "caffe.set_mode_gpu()")  # one line when cupy or a device is missing
    _mode["gpu"] = True


def set_device(device_id):
    _mode["device"] = int(device_id)


def set_random_seed(seed):
    """Seed layerforge's random stream (fillers, dropout, shuffling)."""
    rng.seed(int(seed))


def array_module():
    """numpy, or cupy on the chosen device after :func:`set_mode_gpu`."""
    return gpu_array_module(_mode["device"], "caffe.set_mode_gpu()") if _mode["gpu"] else numpy


def solver_overrides():
    """The solver keys that the global mode sets."""
    return {"solver_mode": "GPU", "device_id": _mode["device"]} if _mode["gpu"] else {}


def has_nccl():
    """True when NCCL can be used here (cupy built with NCCL and a CUDA device)."""
    from ..comm import nccl

    return nccl.available()


class NCCL:
    """pycaffe's NCCL handle. ``NCCL.new_uid()`` makes a unique id (bytes) as Caffe's does.

    Caffe's multi-GPU Python training (one process per GPU, ``NCCL(solver, uid)`` as a solver callback) is
    done in layerforge by ``layerforge train --devices 0,1,...`` or ``mpiexec`` with ``allreduce: nccl``;
    constructing this handle says so.
    """

    @staticmethod
    def new_uid():
        if not has_nccl():
            raise LayerforgeError("caffe.NCCL.new_uid(): NCCL is not available (needs cupy with NCCL and a "
                                  "CUDA device); check caffe.has_nccl() first")
        from cupy.cuda import nccl

        from ..comm.nccl import unique_id_bytes
        return unique_id_bytes(nccl.get_unique_id())

    def __init__(self, solver, uid):
        raise LayerforgeError("caffe.NCCL(solver, uid): multi-GPU training runs through `layerforge train "
                              "--devices 0,1,...` or mpiexec with `allreduce: nccl` (docs/distributed.md)")
