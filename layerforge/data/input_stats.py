"""How well the input keeps up: the time a data layer's forwards waited for their batches, and the input rate.

A data layer counts, in its :class:`InputStats`, every batch it hands out, the seconds its forward waited for
that batch (decode workers not done yet), and the seconds its workers spent making batches. Over a window of
iterations (from :meth:`InputStats.reset`) that gives the input rate, the share of the time the training
waited on input, and what the workers could deliver if they never idled (their capacity). A net's layers are
summed by :func:`layerforge.layers.data.input_stats`.
"""
import time

# Waiting on input for more than this share of the time marks training as input-bound (a batch that takes
# longer to decode than to compute is then the common case, not a hiccup).
INPUT_BOUND_SHARE = 0.1


class InputStats:
    """Counts of one data layer (or the sum of several, by ``+``) since :meth:`reset`.

    Attributes:
        batches, images: handed out by forwards.
        wait_s: seconds forwards spent waiting for their batch.
        decoded: images the workers finished; decode_s: seconds they spent on them, summed over workers.
        workers: decode workers (summed over layers).
        started: ``time.perf_counter()`` at the reset.
    """

    def __init__(self, workers=0):
        self.workers = workers
        self.reset()

    def reset(self):
        """Start a new window: zero the counts and restart the clock."""
        self.batches = self.images = self.decoded = 0
        self.wait_s = self.decode_s = 0.0
        self.started = time.perf_counter()

    def __add__(self, other):
        total = InputStats(self.workers + other.workers)
        for name in ("batches", "images", "decoded", "wait_s", "decode_s"):
            setattr(total, name, getattr(self, name) + getattr(other, name))
        total.started = min(self.started, other.started)
        return total

    @property
    def elapsed_s(self):
        """Seconds since the reset."""
        return time.perf_counter() - self.started

    @property
    def rate(self):
        """Images per second handed out since the reset."""
        return self.images / max(self.elapsed_s, 1e-9)

    @property
    def wait_share(self):
        """The share (0..1) of the time since the reset that forwards waited for their batch."""
        return min(1.0, self.wait_s / max(self.elapsed_s, 1e-9))

    @property
    def capacity(self):
        """Images per second the workers would deliver if never idle (0 before they finished any)."""
        return self.decoded * self.workers / self.decode_s if self.decode_s > 0 else 0.0

    def summary(self, replicas=1):
        """One line for a log: input rate, wait per batch and its share of the time, the workers' capacity; with
        ``replicas`` > 1 these counts are one replica's of a split batch, each reading its shard alike, and the rate,
        workers and capacity are given for all of them together."""
        per_batch = 1e3 * self.wait_s / max(self.batches, 1)
        workers = self.workers * replicas
        whose = f" ({replicas} replicas' shards)" if replicas > 1 else ""
        return (f"input {self.rate * replicas:,.0f} img/s{whose}, waited {per_batch:.1f} ms per batch "
                f"({100 * self.wait_share:.1f}% of the time); {workers} decode worker{'s' * (workers != 1)} could "
                f"deliver {self.capacity * replicas:,.0f} img/s")

    def input_bound(self):
        """True when forwards waited for input more than :data:`INPUT_BOUND_SHARE` of the time since the reset."""
        return self.batches > 0 and self.wait_share > INPUT_BOUND_SHARE

    def warning(self):
        """The line to warn with when :meth:`input_bound`, else None."""
        if not self.input_bound():
            return None
        return (f"training is input-bound: it waited for its batches {100 * self.wait_share:.0f}% of the time; "
                f"{self.workers} decode workers deliver at most {self.capacity:,.0f} img/s. More decode_workers "
                "(--decode-workers) if cores are idle, or cheaper records (smaller images, raw pixels) help")

    def as_dict(self):
        """The counts and rates, JSON-able (``layerforge time --json``)."""
        return {"batches": self.batches, "images": self.images, "wait_s": self.wait_s, "elapsed_s": self.elapsed_s,
                "rate": self.rate, "wait_share": self.wait_share, "capacity": self.capacity, "workers": self.workers}
