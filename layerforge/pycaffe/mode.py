"""pycaffe's global state (Caffe's ``Caffe`` singleton): CPU or GPU mode and the device, the random seed, and the
solver count and rank of one-process-per-GPU training (python/train.py), for the nets and solvers made after it."""
import numpy

from .. import rng
from ..backend import gpu_array_module
from ..errors import LayerforgeError

_mode = {"gpu": False, "device": 0, "solver_count": 1, "solver_rank": 0, "multiprocess": False}


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
    """The solver keys that the global mode sets: pycaffe's solvers follow set_mode_cpu()/set_mode_gpu(), never the
    file's ``solver_mode`` (only Caffe's command-line tool reads that)."""
    return {"solver_mode": "GPU", "device_id": _mode["device"]} if _mode["gpu"] else {"solver_mode": "CPU"}


def solver_count():
    """How many solvers train together (one per process or GPU); 1 unless :func:`set_solver_count` said more."""
    return _mode["solver_count"]


def set_solver_count(count):
    """Solvers made from now on are one of ``count``: their data layers read only their rank's share of the
    records (layerforge's data-parallel shard, as Caffe's data layers split the records between solvers)."""
    _mode["solver_count"] = int(count)


def solver_rank():
    """This process's solver among :func:`solver_count` (0 is the root: it alone displays, tests and snapshots)."""
    return _mode["solver_rank"]


def set_solver_rank(rank):
    _mode["solver_rank"] = int(rank)


def multiprocess():
    return _mode["multiprocess"]


def set_multiprocess(value):
    """Say that the solvers run one per process (python/train.py), as Caffe's flag does; NCCL(...) sets it too."""
    _mode["multiprocess"] = bool(value)


def solver_shard():
    """``(rank, count)`` for layerforge's ``get_solver(shard=...)`` when several solvers train together, else None."""
    return (_mode["solver_rank"], _mode["solver_count"]) if _mode["solver_count"] > 1 else None
