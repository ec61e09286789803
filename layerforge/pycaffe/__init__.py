"""``import layerforge.pycaffe as caffe``: pycaffe's Python interface over layerforge.

A thin face: ``caffe.Net`` and the solvers are views of layerforge's own Net and Solver (see net.py);
model and solver files may be Caffe prototxt or layerforge YAML. docs/caffe-migration.md lists what
differs from Caffe. Every public name of Caffe's pycaffe (python/caffe/__init__.py and the _caffe module) is here.
"""
import sys

from ..errors import LayerforgeError
from ..layers.python_layer import PythonLayerBase as Layer
from . import coord_map, draw, io
from .benchmark import Timer
from .glog import init_log, log
from .mode import (multiprocess, set_device, set_mode_cpu, set_mode_gpu, set_multiprocess, set_random_seed,
                   set_solver_count, set_solver_rank, solver_count, solver_rank)
from .nccl import NCCL, has_nccl
from . import proto
from .net import TEST, TRAIN, Net
from .net_spec import NetSpec, layers, params, to_proto
from .solver import (AdaDeltaSolver, AdaGradSolver, AdamSolver, NesterovSolver, RMSPropSolver, SGDSolver, Solver,
                     SolverParameter, get_solver)
from .classifier import Classifier
from .detector import Detector
from . import classifier, detector

__version__ = "1.0.0"  # the Caffe release whose Python interface this follows
pycaffe = sys.modules[__name__]  # Caffe's module of Net/Solver helpers (caffe.pycaffe); here they are the package's


def layer_type_list():
    """The registered layer type names, sorted."""
    from ..layers import LAYER_REGISTRY

    return sorted(LAYER_REGISTRY)


__all__ = ["coord_map", "has_nccl", "NCCL", "draw", "Layer", "NetSpec", "layers", "params", "to_proto", "proto",
           "Net", "TRAIN", "TEST", "Solver", "SolverParameter", "SGDSolver", "NesterovSolver", "AdaGradSolver",
           "RMSPropSolver", "AdaDeltaSolver", "AdamSolver", "get_solver", "set_mode_cpu", "set_mode_gpu",
           "set_device", "set_random_seed", "layer_type_list", "io", "LayerforgeError", "Timer", "init_log", "log",
           "solver_count", "set_solver_count", "solver_rank", "set_solver_rank", "set_multiprocess", "multiprocess",
           "Classifier", "Detector", "classifier", "detector"]
