"""Communication for data-parallel training over MPI (mpi4py, buffer-based calls only).

    from layerforge.comm import Communicator
    comm = Communicator()                       # COMM_WORLD, groups = shared-memory nodes
    comm.allreduce(grad, algorithm="topology")  # in place, sum over ranks
    comm.mean(grad)                             # average, algorithm chosen by the cost model

Algorithms (``ALGORITHMS``): recursive (Rabenseifner), topology (swCaffe's round-robin mapping), ring,
doubling, mpi (the library's own), nccl (cupy), auto. Row gradients (``SPARSE_ALGORITHMS``, :mod:`.sparse`):
dense, allgather, sharded, summed by ``aggregate(comm, grad, num_rows, algorithm)``. See docs/distributed.md.
"""
from ..launcher import release_segment_names
from .algorithms import ALGORITHMS, available_algorithms, get_algorithm
from .communicator import Communicator, as_communicator, discover_groups
from .cost_model import CostParams
from .guard import abort, guarded, launch_guard
from .sparse import SPARSE_ALGORITHMS, aggregate

# importing mpi4py.MPI (communicator.py) started MPI, whose shared-memory file MPICH unlinks only in MPI_Finalize: its
# name goes now, so that an aborted or killed process leaves no memory behind (launcher.py)
release_segment_names()

__all__ = ["ALGORITHMS", "Communicator", "CostParams", "SPARSE_ALGORITHMS", "abort", "aggregate", "as_communicator",
           "available_algorithms", "discover_groups", "get_algorithm", "guarded", "launch_guard"]
