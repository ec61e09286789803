"""``import layerforge.pycaffe as caffe``: pycaffe's Python interface over layerforge.

A thin face: ``caffe.Net`` and the solvers are views of layerforge's own Net and Solver (see net.py);
model and solver files may be Caffe prototxt or layerforge YAML. docs/caffe-migration.md lists what
differs from Caffe.
"""
from ..errors import LayerforgeError
from ..layers.python_layer import PythonLayerBase as Layer
from . import coord_map, draw, io
from .mode import NCCL, has_nccl, set_device, set_mode_cpu, set_mode_gpu, set_random_seed
from . import proto
from .net import TEST, TRAIN, Net
from .net_spec import NetSpec, layers, params, to_proto
from .solver import (AdaDeltaSolver, AdaGradSolver, AdamSolver, NesterovSolver, RMSPropSolver, SGDSolver, Solver,
                     get_solver)

__version__ = "1.0.0"  # the Caffe release whose Python interface this follows


def layer_type_list():
    """The registered layer type names, sorted."""
    from ..layers import LAYER_REGISTRY

    return sorted(LAYER_REGISTRY)


__all__ = ["coord_map", "has_nccl", "NCCL", "draw", "Layer", "NetSpec", "layers", "params", "to_proto", "proto", "Net", "TRAIN", "TEST", "Solver", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver",
           "AdaDeltaSolver", "AdamSolver", "get_solver", "set_mode_cpu", "set_mode_gpu", "set_device",
           "set_random_seed", "layer_type_list", "io", "LayerforgeError"]
