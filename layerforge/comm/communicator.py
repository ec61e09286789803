"""Communicator: an mpi4py communicator plus the group layout and the byte counters the algorithms need."""
import contextlib
import os

import numpy
from mpi4py import MPI

from ..backend import get_array_module, to_numpy

GROUP_SIZE_ENV = "LAYERFORGE_GROUP_SIZE"
_TAG = 7177


def discover_groups(comm, group_size=None):
    """Group id (0..G-1) of every rank of ``comm``, as a list indexed by rank.

    ``group_size`` Q (or ``$LAYERFORGE_GROUP_SIZE``) makes contiguous groups ``rank // Q``, so one host can
    pretend to be several nodes; otherwise ranks sharing memory (``MPI_Comm_split_type(SHARED)``) form a group.
    """
    if group_size is None and os.environ.get(GROUP_SIZE_ENV):
        group_size = int(os.environ[GROUP_SIZE_ENV])
    if group_size:
        if group_size < 1:
            raise ValueError(f"group size must be >= 1, got {group_size}")
        return [r // group_size for r in range(comm.size)]
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    leader = numpy.array([comm.rank if node.rank == 0 else -1], numpy.int64)
    node.Bcast(leader, root=0)
    node.Free()
    leaders = numpy.empty(comm.size, numpy.int64)
    comm.Allgather(leader, leaders)
    ids = {}
    return [ids.setdefault(int(x), len(ids)) for x in leaders]


class Communicator:
    """An mpi4py communicator with its topology: which group (node, "supernode") every rank lives in.

    Every allreduce algorithm takes a Communicator and sends only through :meth:`sendrecv`, :meth:`send` and
    :meth:`recv`, which move contiguous arrays as raw bytes (buffer-based, no pickling) and add the bytes sent
    to ``bytes_sent["intra"]`` or ``bytes_sent["inter"]`` depending on whether the peer is in this rank's group.

    Args:
        comm: an mpi4py communicator (default ``MPI.COMM_WORLD``).
        group_size: Q ranks per group, contiguous; default ``$LAYERFORGE_GROUP_SIZE`` or shared-memory nodes.
        groups: explicit group id per rank (overrides both).
        cost_params: a :class:`~layerforge.comm.cost_model.CostParams` for ``auto``; measured lazily otherwise.
        timeout: seconds a collective may wait for the last rank from the first rank's arrival, or None for no
            deadline (:mod:`.deadline`: the late rank is named while the others wait, then the job ends).
    """

    def __init__(self, comm=None, group_size=None, groups=None, cost_params=None, timeout=None):
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        if groups is None:
            groups = discover_groups(self.comm, group_size)
        if len(groups) != self.size:
            raise ValueError(f"{len(groups)} group ids for {self.size} ranks")
        self.group_of = [int(g) for g in groups]
        self.num_groups = len(set(self.group_of))
        self.group_size = max(self.group_of.count(g) for g in set(self.group_of))
        self.cost_params = cost_params
        self.last_choice = None  # what ``auto`` picked last
        self.bytes_sent = {"intra": 0, "inter": 0}
        self._scratch = numpy.empty(0, numpy.uint8)
        from .deadline import deadline_for

        self.deadline = deadline_for(self.comm, timeout)

    def collective(self, what):
        """Context around a collective on this communicator (its deadline, when there is one)::

            with comm.collective("allgather of the digests"):
                comm.comm.Allgather(mine, everyone)
        """
        return _NO_DEADLINE if self.deadline is None else self.deadline.collective(what)

    # -- counted point-to-point ------------------------------------------------------------------------------
    def _count(self, nbytes, peer):
        self.bytes_sent["intra" if self.group_of[peer] == self.group_of[self.rank] else "inter"] += nbytes

    def sendrecv(self, sendarr, dest, recvarr, source):
        """Send ``sendarr`` to ``dest`` while receiving ``recvarr`` from ``source`` (both contiguous 1-D)."""
        self._count(sendarr.nbytes, dest)
        self.comm.Sendrecv([sendarr, MPI.BYTE], dest, _TAG, [recvarr, MPI.BYTE], source, _TAG)

    def send(self, arr, dest):
        self._count(arr.nbytes, dest)
        self.comm.Send([arr, MPI.BYTE], dest, _TAG)

    def recv(self, arr, source):
        self.comm.Recv([arr, MPI.BYTE], source, _TAG)

    def scratch(self, n, dtype):
        """A reusable work array of ``n`` elements: a fresh 100 MB allocation per call costs page faults."""
        nbytes = n * numpy.dtype(dtype).itemsize
        if self._scratch.nbytes < nbytes:
            self._scratch = numpy.empty(nbytes, numpy.uint8)
        return self._scratch[:nbytes].view(dtype)

    def reset_counters(self):
        self.bytes_sent = {"intra": 0, "inter": 0}

    # -- collectives -----------------------------------------------------------------------------------------
    def allreduce(self, sendbuf, recvbuf=None, algorithm="auto"):
        """Sum ``sendbuf`` over all ranks into ``recvbuf`` (in place when ``recvbuf`` is None); returns it.

        Device (cupy) arrays go through NCCL when ``algorithm`` is ``nccl``; otherwise they are staged through
        host memory because the PyPI MPI builds are not CUDA-aware.
        """
        from .algorithms import get_algorithm

        fn = get_algorithm(algorithm)
        out = sendbuf if recvbuf is None else recvbuf
        xp = get_array_module(sendbuf, out)
        if xp is numpy or algorithm == "nccl":
            with self.collective("allreduce"):
                fn(self, sendbuf, out)
            return out
        host = numpy.ascontiguousarray(to_numpy(sendbuf))  # .get() synchronises the stream first
        with self.collective("allreduce"):
            fn(self, host, None)
        out.set(host.reshape(out.shape))
        return out

    def mean(self, sendbuf, recvbuf=None, algorithm="auto"):
        """The average over ranks: :meth:`allreduce` then divide by ``size``."""
        out = self.allreduce(sendbuf, recvbuf, algorithm)
        out /= out.dtype.type(self.size)
        return out

    def bcast(self, buf, root=0):
        """Broadcast a contiguous array in place from ``root`` (buffer-based ``Bcast``); returns it."""
        if get_array_module(buf) is numpy:
            with self.collective("broadcast"):
                self.comm.Bcast([buf, MPI.BYTE], root=root)
            return buf
        host = numpy.ascontiguousarray(to_numpy(buf))
        with self.collective("broadcast"):
            self.comm.Bcast([host, MPI.BYTE], root=root)
        buf.set(host)
        return buf

    def barrier(self):
        with self.collective("barrier"):
            self.comm.Barrier()


_NO_DEADLINE = contextlib.nullcontext()


def as_communicator(comm):
    """Wrap a bare mpi4py communicator (groups from shared memory); pass a Communicator through."""
    return comm if isinstance(comm, Communicator) else Communicator(comm)
