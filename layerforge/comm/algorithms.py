"""The name -> allreduce function table. Every entry is ``fn(comm, sendbuf, recvbuf=None) -> array``:
``comm`` a :class:`~layerforge.comm.Communicator`, in place when ``recvbuf`` is None (or ``sendbuf`` is
``MPI.IN_PLACE``), sum over ranks.
"""
from . import cost_model
from .buffers import prepare
from .hierarchical import allreduce_hierarchical
from .mpi_native import allreduce_mpi
from .nccl import allreduce_nccl, available as nccl_available
from .recursive import allreduce_doubling, allreduce_recursive
from .ring import allreduce_ring
from .topology import allreduce_topology


def allreduce_auto(comm, sendbuf, recvbuf=None):
    """The algorithm the cost model predicts fastest for this size (``comm.last_choice`` records it).

    The parameters come from ``comm.cost_params`` (given in config) or a calibration cached to a file.
    """
    if comm.cost_params is None:
        comm.cost_params = cost_model.load_or_calibrate(comm)
    buf = prepare(sendbuf, recvbuf)
    comm.last_choice = cost_model.choose(buf.nbytes, comm.size, comm.group_size, comm.cost_params)
    ALGORITHMS[comm.last_choice](comm, buf)
    return sendbuf if recvbuf is None else recvbuf


ALGORITHMS = {
    "recursive": allreduce_recursive,
    "topology": allreduce_topology,
    "ring": allreduce_ring,
    "doubling": allreduce_doubling,
    "hierarchical": allreduce_hierarchical,
    "mpi": allreduce_mpi,
    "nccl": allreduce_nccl,
    "auto": allreduce_auto,
}


def get_algorithm(name):
    """The allreduce function called ``name``; unknown names list the choices."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise KeyError(f"unknown allreduce algorithm {name!r}; choose from {', '.join(ALGORITHMS)}") from None


def available_algorithms():
    """Names usable on this machine (``nccl`` only with cupy and a device)."""
    return [name for name in ALGORITHMS if name != "nccl" or nccl_available()]
