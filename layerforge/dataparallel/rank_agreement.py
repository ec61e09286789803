"""What keeps the MPI ranks of one job one training run: one configuration (:func:`config_digest` checked by
:func:`check_same` at the start), the same parameters at every snapshot (:func:`parameters_digest`), test scores
summed over the ranks' test shards (a detection test's rows gathered), the same action on a signal request, and
the snapshot's states of every rank (:class:`RankAgreement`); and the sum that makes a MultiBoxLoss count the
matches of every rank's batch (:class:`RankSum`)."""
import hashlib
import json
import os

import numpy

from .. import backend
from ..errors import LayerforgeError
from ..solvers.seam import Seam

_ACTIONS = ("none", "snapshot", "stop")


def pack(blobs, what="data"):
    """All ``blob.<what>`` arrays as one contiguous float64 host vector."""
    if not blobs:
        return numpy.zeros(0)
    return numpy.concatenate([backend.to_numpy(getattr(b, what)).astype(numpy.float64).reshape(-1) for b in blobs])


def _allgather_digest(comm, digest):
    mine = numpy.frombuffer(digest, dtype=numpy.uint8).copy()
    everyone = numpy.zeros((comm.size, mine.size), numpy.uint8)
    with comm.collective("allgather of the digests"):
        comm.comm.Allgather(mine, everyone)
    return [bytes(row) for row in everyone]


def check_same(comm, digest, what):
    """Raise (on every rank) naming the first rank whose ``digest`` differs from rank 0's."""
    digests = _allgather_digest(comm, digest)
    for r, d in enumerate(digests):
        if d != digests[0]:
            raise LayerforgeError(f"rank {r} has a different {what} than rank 0 "
                                  f"({d.hex()[:12]} vs {digests[0].hex()[:12]})")


def config_digest(sp, overrides):
    """sha256 over the solver file, the net files it names, and the command-line overrides."""
    h = hashlib.sha256()
    paths = [sp.path] + [sp.resolve(p) for p in [sp.net, sp.train_net, *sp.test_net] if p]
    for path in paths:
        if path and os.path.exists(path):
            with open(path, "rb") as f:
                h.update(f.read())
    for inline in (sp.net_param, sp.train_net_param, sp.test_net_param):
        if inline:
            h.update(json.dumps(inline, sort_keys=True, default=str).encode())
    h.update(json.dumps(overrides, sort_keys=True, default=str).encode())
    return h.digest()


def parameters_digest(net):
    """sha256 of the learnable parameters. Not of statistics blobs: each rank's BatchNorm running mean and
    variance follow its own batches (as in Caffe's multi-GPU training and PyTorch DDP without SyncBatchNorm),
    so they differ between ranks; rank 0's are the ones snapshotted. Blobs with lr_mult 0 (BatchNorm's
    statistics among them) are left out for that reason."""
    trained = [p for p, lr in zip(net.learnable_params, net.params_lr) if lr]
    return hashlib.sha256(pack(trained).tobytes()).digest()


class RankAgreement(Seam):
    """What keeps the ranks of one job one training run: rank 0 is the root (it displays and snapshots), every rank
    tests its shard and the test outputs are summed over the ranks (a detection test's rows gathered from them),
    every rank acts on the most drastic signal request of any rank (stop > snapshot > none), and before a snapshot
    all ranks check that their parameters are still the same and hand rank 0 their own states (random stream, read
    positions, engine choices), which the snapshot keeps: a job resumed on as many ranks continues each rank where
    it was.

    Args:
        comm: a :class:`~layerforge.comm.Communicator`. solver: the rank's Solver (its net and iteration are read).
    """

    shares_tests = True
    agrees = True

    def __init__(self, comm, solver):
        self.comm, self.solver = comm, solver
        self.root = comm.rank == 0

    def reduce_test(self, sums, loss, n):
        flat = numpy.concatenate([numpy.asarray(s, numpy.float64).reshape(-1) for s in sums or []] + [[loss, n]])
        self.comm.allreduce(flat, algorithm="mpi")
        out, offset = [], 0
        for s in sums or []:
            out.append(flat[offset:offset + s.size].reshape(s.shape))
            offset += s.size
        return out, float(flat[-2]), int(round(flat[-1]))

    def gather_test_rows(self, rows):
        # eval_type DETECTION: the mAP of all the ranks' test shards needs every detection, not a sum of outputs
        from mpi4py import MPI

        rows = numpy.ascontiguousarray(rows, numpy.float64).reshape(-1)
        counts = numpy.zeros(self.comm.size, numpy.int64)
        with self.comm.collective("allgather of the detections"):
            self.comm.comm.Allgather(numpy.array([rows.size], numpy.int64), counts)
            gathered = numpy.empty(int(counts.sum()), numpy.float64)
            self.comm.comm.Allgatherv(rows, [gathered, counts, numpy.cumsum(counts) - counts, MPI.DOUBLE])
        return gathered.reshape(-1, 5)

    def agree(self, action):
        from mpi4py import MPI

        code = numpy.array([_ACTIONS.index(action)], numpy.int32)
        with self.comm.collective("agreement on signals"):
            self.comm.comm.Allreduce(MPI.IN_PLACE, code, op=MPI.MAX)
        return _ACTIONS[int(code[0])]

    def before_snapshot(self):
        check_same(self.comm, parameters_digest(self.solver.net), f"set of parameters at iteration {self.solver.iter}")

    def gather_states(self, states):
        from mpi4py import MPI

        comm, root = self.comm.comm, self.comm.rank == 0
        mine = numpy.frombuffer(json.dumps(states).encode(), numpy.uint8)
        counts = numpy.zeros(self.comm.size, numpy.int64)
        with self.comm.collective("gather of the data states"):
            comm.Gather(numpy.array([mine.size], numpy.int64), counts, root=0)
            everyone = numpy.empty(int(counts.sum()) if root else 0, numpy.uint8)
            comm.Gatherv(mine, [everyone, counts, MPI.BYTE] if root else None, root=0)
        if not root:
            return states
        bounds = numpy.cumsum([0, *counts])
        return [text for lo, hi in zip(bounds, bounds[1:]) for text in json.loads(everyone[lo:hi].tobytes())]

    def replica(self):
        return self.comm.rank, self.comm.size


class RankSum(Seam):
    """``sum(values)``: a small float64 vector summed over the ranks, on a communicator of its own (the gradient
    exchange may run its collectives on another thread meanwhile); ``count`` the ranks. A MultiBoxLoss counts the
    matches of all the ranks' batches with it (its VALID normaliser is then the whole batch's).

    Only the training passes, which every rank makes in step, may sum: :meth:`before_pass` allows the next sum; a
    forward that rank 0 alone makes (the final loss line) finds it disarmed and sums nothing."""

    def __init__(self, comm):
        self.comm, self.count, self.armed = comm.comm.Dup(), comm.size, False
        self.collective = comm.collective  # the deadline of the ranks' collectives

    def before_pass(self, k):
        self.armed = True

    def sum(self, values):
        from mpi4py import MPI

        self.armed = False
        out = numpy.array(values, numpy.float64).reshape(-1)
        with self.collective("sum over the ranks"):
            self.comm.Allreduce(MPI.IN_PLACE, out, op=MPI.SUM)
        return out
