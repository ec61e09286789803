"""layerforge: Caffe-style, config-driven deep learning in Python (numpy on CPU, cupy on GPU).

pycaffe-style API::

    import layerforge
    net = layerforge.Net("configs/lenet.yaml", phase="test")
    out = net.forward(data=images)          # {output blob name: array}
    net.blobs["conv1"].data, net.params["conv1"][0].diff
    solver = layerforge.get_solver("configs/lenet_solver.yaml")
    solver.step(100)
"""
from .errors import interrupting_start_up

interrupting_start_up()  # first: in the command, a Ctrl-C during the imports that follow ends it in one line

from .cores import limit_threads_per_rank  # noqa: E402

limit_threads_per_rank()  # before numpy loads its BLAS

from .emulated_gpu import install_if_requested  # noqa: E402

install_if_requested()  # LAYERFORGE_EMULATED_GPU=1: the emulated device stands in for cupy (docs/gpu.md)

from .errors import ConfigError, DataError, LayerforgeError, ShapeError  # noqa: E402

__version__ = "0.1.0"

# Net, Solver and get_solver load on first use (PEP 562): the ``layerforge`` command starts without numpy and
# the nets, so that a rank's supervisor under mpiexec is ready for signals within a few tens of milliseconds
def __getattr__(name):
    if name == "Net":
        from .net.net import Net as value
    elif name in ("Solver", "get_solver"):
        from . import solvers

        value = getattr(solvers, name)
    else:
        raise AttributeError(f"module 'layerforge' has no attribute {name!r}")
    globals()[name] = value
    return value
