"""layerforge: Caffe-style, config-driven deep learning in Python (numpy on CPU, cupy on GPU).

pycaffe-style API::

    import layerforge
    net = layerforge.Net("configs/lenet.yaml", phase="test")
    out = net.forward(data=images)          # {output blob name: array}
    net.blobs["conv1"].data, net.params["conv1"][0].diff
    solver = layerforge.get_solver("configs/lenet_solver.yaml")
    solver.step(100)
"""
from .cores import limit_threads_per_rank

limit_threads_per_rank()  # before numpy loads its BLAS

from .kernels.cuda.emulator.install import install_if_requested  # noqa: E402

install_if_requested()  # LAYERFORGE_EMULATED_GPU=1: the emulated device stands in for cupy (docs/gpu.md)

from .errors import ConfigError, DataError, LayerforgeError, ShapeError  # noqa: E402
from .net.net import Net  # noqa: E402
from .solvers import Solver, get_solver  # noqa: E402

__version__ = "0.1.0"

__all__ = ["Net", "Solver", "get_solver", "LayerforgeError", "ConfigError", "ShapeError", "DataError", "__version__"]
