"""Synchronous data parallelism over MPI ranks, mathematically the same as one process with the total batch.

``mpiexec -n P layerforge train --solver S`` runs P replicas. Each reads a disjoint shard of the data with batch
b; :func:`make_data_parallel` checks that the ranks run one configuration, broadcasts rank 0's parameters
(:func:`broadcast_parameters`) and gives the solver its seams (layerforge/solvers/seam.py) in the order they act:
the dense exchange (:mod:`.gradient_exchange`), the row gradients' exchange (:mod:`.sparse_exchange`), the ranks'
agreement and the MultiBoxLoss's sum over the ranks (:mod:`.rank_agreement`).
"""
import collections
import logging

import numpy

from .. import backend
from .gradient_exchange import GradientExchange, gradient_ready_after, holder_names
from .rank_agreement import RankAgreement, RankSum, check_same
from .sparse_exchange import SparseGradientExchange

log = logging.getLogger("layerforge")


def broadcast_parameters(comm, net, root=0):
    """Copy every parameter blob of ``net`` (learnable and statistics) from ``root`` to all ranks."""
    blobs = [b for layer in net.layers for b in layer.blobs]
    seen, unique = set(), []
    for b in blobs:
        if id(b) not in seen:
            seen.add(id(b))
            unique.append(b)
    if not unique:
        return
    flat = numpy.concatenate([backend.to_numpy(b.data).reshape(-1) for b in unique]).astype(unique[0].dtype)
    comm.bcast(flat, root=root)
    offset = 0
    for b in unique:
        b.data[...] = b.xp.asarray(flat[offset:offset + b.count].reshape(b.shape))
        offset += b.count


class RankSeams(collections.namedtuple("RankSeams", "dense sparse ranks batch_sum")):
    """What :func:`make_data_parallel` gave a solver: the :class:`GradientExchange`, the
    :class:`SparseGradientExchange` (None without row gradients), the :class:`RankAgreement` and the
    :class:`RankSum` of the MultiBoxLoss layers (None without them)."""


def make_data_parallel(solver, comm, algorithm=None, digest=None):
    """Train ``solver`` (built with ``shard=(comm.rank, comm.size)``) data parallel over ``comm``: check that the
    ranks run one configuration (``digest``, :func:`config_digest`), broadcast rank 0's parameters, and give the
    solver the seams of this module (:meth:`~layerforge.solvers.Solver.add_seam`) in the order they act.

    Parameters with row gradients (Embed) go through a :class:`SparseGradientExchange` unless ``sparse_aggregation``
    is ``dense``. Returns the :class:`RankSeams` (the exchanges' ``seconds`` tell the time spent communicating).
    """
    sp = solver.param
    if digest is not None:
        check_same(comm, digest, "configuration (solver or net files, or command-line options)")
    broadcast_parameters(comm, solver.net)
    params = solver.net.learnable_params
    # double buffering delays every gradient by one iteration, the row gradients too: they go dense
    rows = [p for p in params if p.sparse_rows] if sp.sparse_aggregation != "DENSE" and not sp.double_buffering else []
    dense = [p for p in params if not any(p is q for q in rows)]
    overlap = sp.allreduce_overlap and not sp.double_buffering
    exchange = GradientExchange(dense, comm, algorithm or sp.allreduce.lower(),
                                bucket_bytes=int(sp.allreduce_bucket_mb * 2 ** 20), fp16=sp.allreduce_fp16,
                                ready_after=gradient_ready_after(solver.net, dense), overlap=overlap,
                                double_buffering=sp.double_buffering, names=holder_names(solver.net, dense),
                                iter_size=sp.iter_size)
    solver.add_seam(exchange)
    sparse = None
    if rows:
        sparse = SparseGradientExchange(rows, comm, sp.sparse_aggregation.lower(), algorithm or sp.allreduce.lower())
        solver.add_seam(sparse)
    ranks = RankAgreement(comm, solver)
    solver.add_seam(ranks)
    batch_sum = None
    if any(layer.type == "MultiBoxLoss" for layer in solver.net.layers):
        batch_sum = RankSum(comm)
        solver.add_seam(batch_sum)
        solver.net.set_batch_group(batch_sum, ("MultiBoxLoss",))
    mode = ("double buffering (updates use the previous iteration's gradients)" if sp.double_buffering else
            "overlapped with backward" if exchange.overlaps else
            "after backward (allreduce_overlap, but every bucket is ready only when backward ends; a "
            "smaller allreduce_bucket_mb splits them)" if overlap else "after backward")
    log.info("Data parallel over %d ranks (%d node group(s)): allreduce %s, %d gradient values in %d bucket(s)%s, %s",
             comm.size, comm.num_groups, exchange.algorithm, exchange.buffer.size, len(exchange.buckets),
             ", float16 payload" if exchange.fp16 else "", mode)
    if rows:
        log.info("%d parameter(s) with row gradients (%s) left out of the allreduce: sparse aggregation %s",
                 len(rows), ", ".join(p.name or "?" for p in rows), sparse.algorithm)
    return RankSeams(exchange, sparse, ranks, batch_sum)
