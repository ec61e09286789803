"""Sums of small vectors across the replicas of one batch, through shared memory: BatchNorm's per-channel sums.

Replicas that each hold a share of a batch (``WorkerOptions.split``) normalise with the whole batch's statistics
(layerforge/kernels/batch_norm.py): per BatchNorm layer, one exchange of 2C values forward (two where a channel's
mean is large against its spread) and one of 2C backward. Each replica writes its values into its row of a shared
table and then its sequence number; it waits until every row carries that number and adds the rows, in row order, so
every replica gets the same bits. Two tables alternate: a replica can only write call k + 2 into the table of call k
once every replica has written call k + 1, which it does after reading call k.
"""
import os
import time

import numpy

from .waits import waiting

CAPACITY = 4096  # values per exchange; longer vectors go in several
SPINS = 200  # the wait yields the core this many times before it sleeps between looks


class ReplicaSum:
    """``sum(values)``: the float64 vector summed over the ``count`` replicas (module docstring).

    Args:
        table: a shared double array of :func:`table_size` values; g, count: this replica and the replicas.
        check: called while waiting (raises when the job is failing).
    """

    def __init__(self, table, g, count, check=lambda: None):
        self.g, self.count, self.check = g, count, check
        self.table = numpy.frombuffer(table, dtype=numpy.float64).reshape(2, count, 1 + CAPACITY)
        self.calls = 0

    def sum(self, values):
        values = numpy.asarray(values, dtype=numpy.float64).reshape(-1)
        out = numpy.empty_like(values)
        for start in range(0, max(1, len(values)), CAPACITY):
            out[start:start + CAPACITY] = self._sum(values[start:start + CAPACITY])
        return out

    def _sum(self, part):
        self.calls += 1
        rows = self.table[self.calls % 2]
        n = len(part)
        rows[self.g, 1:1 + n] = part
        rows[self.g, 0] = self.calls  # written last: the row is complete
        spins = 0
        with waiting():
            while (rows[:, 0] < self.calls).any():
                spins += 1
                if spins < SPINS:
                    os.sched_yield()
                else:
                    self.check()
                    time.sleep(0.00005)
        return rows[:, 1:1 + n].sum(axis=0)


def table_size(count):
    """Doubles the shared table of ``count`` replicas holds."""
    return 2 * count * (1 + CAPACITY)


def share_batch_statistics(net, group):
    """Make every BatchNorm of ``net`` normalise with the statistics of the whole batch of ``group``'s replicas,
    and every MultiBoxLoss count the matches of the whole batch."""
    net.set_batch_group(group, ("BatchNorm", "MultiBoxLoss"))
