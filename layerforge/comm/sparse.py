"""Summing row gradients over ranks: the sparse paths of Parallax (Kim et al., EuroSys 2019).

An embedding's gradient touches only the rows of the tokens in the batch. Every path here has the signature
``fn(comm, grad, num_rows) -> SparseGradient``: ``grad`` this rank's rows (a
:class:`~layerforge.blob.SparseGradient` of a (num_rows, ...) parameter), the result the sum over all ranks,
the same on every rank. Each row travels as one record (its int64 index, then its values), so a path needs
one message of records plus one of counts per step. Buffers move with the uppercase, buffer-based mpi4py
calls (no pickling); the bytes
each rank sends are added to ``comm.bytes_sent`` as the allreduce algorithms do.

    dense      scatter the rows into a (num_rows, ...) array and allreduce it: n = num_rows rows
    allgather  every rank receives every rank's (indices, rows) (Allgatherv) and sums them locally
    sharded    row r belongs to rank r mod P. Each rank sends the rows of every shard to its owner
               (Alltoallv); owners sum them and send the summed shard back (Allgatherv): every replica
               holds the whole table and updates it, so every rank needs every summed row. With several
               groups (nodes) of more than one rank, the ranks of a group first gather their rows to the
               group's leader, which sums them; the leaders run the sharded exchange among themselves and
               broadcast the result inside their group.

``dense`` returns the non-zero rows of the sum (so ``sparse_update: lazy`` sees the same rows on every path,
except a row whose contributions cancel exactly). Row r mod P spreads the frequent (low) token ids over
the owners; contiguous blocks would put most of a Zipf-distributed batch on rank 0.
"""
import numpy
from mpi4py import MPI

from ..backend import get_array_module, to_numpy
from ..blob import SparseGradient
from .hierarchical import group_members, tree_broadcast


class _Members:
    """The ranks taking part in one exchange: an mpi4py communicator over them and their ranks in ``comm``."""

    def __init__(self, comm, mpi, ranks):
        self.comm, self.mpi, self.ranks = comm, mpi, list(ranks)
        self.me = self.mpi.Get_rank()

    def count_to_all(self, nbytes):
        for k, r in enumerate(self.ranks):
            if k != self.me:
                self.comm._count(int(nbytes), r)

    def allgather_counts(self, n):
        counts = numpy.empty(len(self.ranks), numpy.int64)
        self.mpi.Allgather(numpy.array([n], numpy.int64), counts)
        self.count_to_all(8)
        return counts

    def allgatherv(self, send, counts):
        """Concatenate every member's 1-D ``send`` (``counts[k]`` elements from member k)."""
        recv = numpy.empty(int(counts.sum()), send.dtype)
        self.mpi.Allgatherv(numpy.ascontiguousarray(send), [recv, (counts.tolist(), _displacements(counts))])
        self.count_to_all(send.nbytes)
        return recv

    def alltoallv(self, send, sendcounts, recvcounts):
        """Member k receives ``send``'s k-th run of ``sendcounts[k]`` elements; returns what this rank receives."""
        recv = numpy.empty(int(recvcounts.sum()), send.dtype)
        self.mpi.Alltoallv([numpy.ascontiguousarray(send), (sendcounts.tolist(), _displacements(sendcounts))],
                           [recv, (recvcounts.tolist(), _displacements(recvcounts))])
        for k, r in enumerate(self.ranks):
            if k != self.me:
                self.comm._count(int(sendcounts[k]) * send.itemsize, r)
        return recv


def _displacements(counts):
    return numpy.concatenate([[0], numpy.cumsum(counts)[:-1]]).astype(numpy.int64).tolist()


def _everyone(comm):
    return _Members(comm, comm.comm, range(comm.size))


def _records(grad):
    """(k, 8 + row bytes) uint8: each row's index followed by its values, so one message carries both."""
    k = len(grad)
    width = int(numpy.prod(grad.rows.shape[1:], dtype=numpy.int64))
    out = numpy.empty((k, 8 + width * grad.rows.itemsize), numpy.uint8)
    out[:, :8] = grad.indices.astype(numpy.int64).view(numpy.uint8).reshape(k, 8)
    out[:, 8:] = numpy.ascontiguousarray(grad.rows).reshape(k, width).view(numpy.uint8)
    return out


def _unpack(records, row_shape, dtype):
    indices = numpy.ascontiguousarray(records[:, :8]).view(numpy.int64).reshape(-1)
    rows = numpy.ascontiguousarray(records[:, 8:]).view(dtype).reshape((-1,) + tuple(row_shape))
    return indices, rows


def _gather_rows(members, grad):
    """Every member's (indices, rows) concatenated on every member (not yet summed)."""
    records = _records(grad)
    counts = members.allgather_counts(len(grad))
    gathered = members.allgatherv(records.reshape(-1), counts * records.shape[1])
    return _unpack(gathered.reshape(-1, records.shape[1]), grad.rows.shape[1:], grad.rows.dtype)


def sparse_dense(comm, grad, num_rows, allreduce="auto"):
    """The rows scattered into a dense (num_rows, ...) array, summed by the allreduce ``allreduce``."""
    dense = numpy.zeros((num_rows,) + tuple(grad.rows.shape[1:]), grad.rows.dtype)
    grad.add_to(dense)
    comm.allreduce(dense.reshape(-1), algorithm=allreduce)
    return SparseGradient.from_dense(dense)


def sparse_allgather(comm, grad, num_rows):
    """Allgatherv of every rank's (indices, rows), then duplicates summed locally."""
    return SparseGradient.coalesce(*_gather_rows(_everyone(comm), grad))


def _sharded(members, grad):
    P = len(members.ranks)
    owner = grad.indices % P
    records = _records(grad)[numpy.argsort(owner, kind="stable")]
    sendcounts = numpy.bincount(owner, minlength=P).astype(numpy.int64)
    recvcounts = numpy.empty(P, numpy.int64)
    members.mpi.Alltoall(sendcounts, recvcounts)
    members.count_to_all(8)
    width = records.shape[1]
    received = members.alltoallv(records.reshape(-1), sendcounts * width, recvcounts * width)
    shard = SparseGradient.coalesce(*_unpack(received.reshape(-1, width), grad.rows.shape[1:], grad.rows.dtype))
    indices, rows = _gather_rows(members, shard)
    order = numpy.argsort(indices, kind="stable")  # shards are disjoint: sorting is all that is left
    return SparseGradient(indices[order], rows[order])


def _leaders_mpi(comm, leaders):
    # MPI_Comm_split is collective and not free: one leaders' communicator per Communicator
    cached = getattr(comm, "_sparse_leaders_mpi", None)
    if cached is None:
        cached = comm.comm.Split(0 if comm.rank in leaders else MPI.UNDEFINED, comm.rank)
        comm._sparse_leaders_mpi = cached
    return cached


def _gather_to_leader(comm, grad, members):
    if comm.rank != members[0]:
        comm.send(numpy.array([len(grad)], numpy.int64), members[0])
        comm.send(grad.indices, members[0])
        comm.send(numpy.ascontiguousarray(grad.rows), members[0])
        return None
    indices, rows = [grad.indices], [grad.rows]
    for r in members[1:]:
        n = numpy.empty(1, numpy.int64)
        comm.recv(n, r)
        indices.append(numpy.empty(int(n[0]), numpy.int64))
        rows.append(numpy.empty((int(n[0]),) + tuple(grad.rows.shape[1:]), grad.rows.dtype))
        comm.recv(indices[-1], r)
        comm.recv(rows[-1], r)
    return SparseGradient.coalesce(numpy.concatenate(indices), numpy.concatenate(rows))


def _broadcast_in_group(comm, summed, members, row_shape, dtype):
    n = numpy.array([len(summed) if summed is not None else 0], numpy.int64)
    tree_broadcast(comm, n, members)
    if summed is None:
        summed = SparseGradient(numpy.empty(int(n[0]), numpy.int64),
                                numpy.empty((int(n[0]),) + tuple(row_shape), dtype))
    tree_broadcast(comm, summed.indices, members)
    tree_broadcast(comm, summed.rows.reshape(-1), members)
    return summed


def sparse_sharded(comm, grad, num_rows):
    """Parallax's sharded aggregation (see the module docstring), with in-group aggregation first when the
    ranks form several groups of more than one rank."""
    members, leaders = group_members(comm)
    if comm.num_groups == 1 or comm.group_size == 1:
        return _sharded(_everyone(comm), grad)
    local = _gather_to_leader(comm, grad, members)
    leaders_mpi = _leaders_mpi(comm, leaders)
    summed = _sharded(_Members(comm, leaders_mpi, leaders), local) if local is not None else None
    return _broadcast_in_group(comm, summed, members, grad.rows.shape[1:], grad.rows.dtype)


SPARSE_ALGORITHMS = {"dense": sparse_dense, "allgather": sparse_allgather, "sharded": sparse_sharded}


def aggregate(comm, grad, num_rows, algorithm, allreduce="auto"):
    """Sum ``grad`` over the ranks of ``comm`` by ``algorithm`` (``dense``, ``allgather``, ``sharded``).

    Device (cupy) rows are staged through host memory (the PyPI MPI builds are not CUDA-aware); the result
    lives where ``grad`` does.
    """
    try:
        fn = SPARSE_ALGORITHMS[algorithm]
    except KeyError:
        raise KeyError(f"unknown sparse aggregation {algorithm!r}; choose from "
                       f"{', '.join(SPARSE_ALGORITHMS)}") from None
    xp = get_array_module(grad.rows)
    host = SparseGradient(numpy.ascontiguousarray(to_numpy(grad.indices), numpy.int64),
                          numpy.ascontiguousarray(to_numpy(grad.rows)))
    summed = fn(comm, host, num_rows, allreduce) if algorithm == "dense" else fn(comm, host, num_rows)
    if xp is numpy:
        return summed
    return SparseGradient(xp.asarray(summed.indices), xp.asarray(summed.rows))
