"""pycaffe's global mode: CPU or GPU (and which device) for the nets and solvers made after it is set."""
import numpy

from .. import rng
from ..backend import gpu_array_module

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
