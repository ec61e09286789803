"""layerforge: Caffe-style, config-driven deep learning in Python (numpy on CPU, cupy on GPU).

pycaffe-style API::

    import layerforge
    net = layerforge.Net("configs/lenet.yaml", phase="test")
    out = net.forward(data=images)          # {output blob name: array}
    net.blobs["conv1"].data, net.params["conv1"][0].diff
    solver = layerforge.get_solver("configs/lenet_solver.yaml")
    solver.step(100)
"""
from .errors import ConfigError, DataError, LayerforgeError, ShapeError
from .net import Net
from .solvers import Solver, get_solver

__version__ = "0.1.0"

__all__ = ["Net", "Solver", "get_solver", "LayerforgeError", "ConfigError", "ShapeError", "DataError", "__version__"]
