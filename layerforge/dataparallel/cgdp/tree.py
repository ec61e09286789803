"""The baseline (``sync: tree``): after backward, worker 0 gathers and sums, updates, and broadcasts.

This is the shape of Caffe's P2PSync on one host: nothing moves until backward has finished on every
device; the root then reduces all partial gradients, runs the update alone, and every other replica waits
for the new parameters. Through shared host memory the gather is flat (each worker copies its whole
gradient into its slot at once; a CPU replica's diffs already are its slot), so the root's reduction
costs (G - 1) additions of P values.

Worker g > 0 skips the update (the root's solver state is the only one) and copies the broadcast
parameters in; the parent only relays "all posted" to worker 0 and "parameters ready" to the others.
"""
import time

from ... import trace
from ...solvers.seam import Seam


class TreeSync(Seam):
    """Worker side of tree mode: before the update the gather (worker 0 sums every slot into its diffs and
    updates alone; the others skip the update), at the end of the iteration the broadcast of worker 0's
    parameters."""

    def __init__(self, solver, link, g, slots, params, mover, timer):
        self.solver, self.link, self.g, self.slots, self.params = solver, link, g, slots, params
        self.mover, self.timer = mover, timer
        self.all = list(range(len(solver.net.learnable_params)))
        mover.attach_diffs(slots[g])  # CPU replicas: the gather needs no copy, the root reads the slots

    def before_update(self):
        """The gather: worker 0 adds the other slots into its diffs and averages; True on worker 0 alone."""
        solver = self.solver
        t0 = time.perf_counter()
        with trace.wait("comm", "tree gather"):  # after backward: all of the exchange is exposed
            if self.g != 0:
                self.mover.to_host(self.all, self.slots[self.g], self.mover.mark())
                self.link.send(("post_all",))
            else:
                self.link.expect("gathered")
                G = self.slots.shape[0]
                params = solver.net.learnable_params
                add_slots_to_diffs(params, self.mover.offsets, self.slots[1:], solver.xp)
                if G > 1:
                    scale_diffs(params, 1.0 / G)
        self.timer.add("exchange", time.perf_counter() - t0)
        return self.g == 0

    def end_iteration(self, iteration, loss):
        """The broadcast: worker 0 publishes its updated parameters, the others copy them in."""
        t0 = time.perf_counter()
        with trace.wait("comm", "tree broadcast"):
            if self.g == 0:
                self.mover.params_to_host(self.params)
                self.link.send(("params",))
            else:
                self.link.expect("params")
                self.mover.params_from_host(self.params)
        self.timer.add("exchange", time.perf_counter() - t0)


def add_slots_to_diffs(params, offsets, slots, xp):
    """The root's reduction: ``diff += slot`` for every row of ``slots`` (moved to the root's device first)."""
    for p, (off, n) in zip(params, offsets):
        diff = p.diff
        for row in slots:
            diff += xp.asarray(row[off:off + n].reshape(diff.shape))


def scale_diffs(params, scale):
    for p in params:
        diff = p.diff
        diff *= diff.dtype.type(scale)
