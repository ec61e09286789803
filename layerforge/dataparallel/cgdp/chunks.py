"""Chunks: consecutive layers with parameters whose gradients travel to the host together.

Backward visits the layers in reverse; a learnable parameter is final once the *lowest-indexed* layer using
it has run backward (a shared parameter collects diffs from every user). A *unit* is the set of parameters
that become final at one layer; units are listed in backward order (the loss end first) and laid out
contiguously in one flat buffer, so a chunk of consecutive units is one contiguous segment.

``make_chunks`` groups units ``chunk_size`` at a time, except the last ``tail`` units of backward (the first
layers of the net), which stay alone: whatever is in flight when backward ends is exposed, so the end of
backward ships small pieces. ``ChunkSearch`` is the run-time search for ``chunk_size: auto``. :data:`WHOLE` puts
every unit in one chunk, posted when backward ends: the replicas of one split batch that make the mean in their
update (cgdp/host.py) have nothing to overlap with backward.
"""
import logging
import math

log = logging.getLogger("layerforge")

TAIL = 2  # units at the end of backward that always form chunks of size 1
WHOLE = "whole"  # the chunk size of one chunk of every unit (not a user's setting: parse_chunk_size refuses it)


class Unit:
    """Parameters that become final at layer ``layer`` (net index): ``params`` are learnable_params indices."""

    def __init__(self, layer, name, params, offset, size):
        self.layer, self.name, self.params, self.offset, self.size = layer, name, params, offset, size

    def __repr__(self):
        return f"Unit({self.name!r}, layer={self.layer}, size={self.size})"


class Chunk:
    """Units ``units`` (consecutive in backward order) = the flat segment [offset, offset + size)."""

    def __init__(self, index, units):
        self.index, self.units = index, units
        self.offset = units[0].offset
        self.size = sum(u.size for u in units)
        self.last_layer = units[-1].layer  # the chunk is complete after this layer's backward
        self.name = units[0].name if len(units) == 1 else f"{units[0].name}..{units[-1].name}"

    @property
    def params(self):
        return [p for u in self.units for p in u.params]


def param_units(net):
    """The units of ``net`` in backward order; their flat offsets cover all learnable parameters once."""
    index = {id(b): k for k, b in enumerate(net.learnable_params)}
    final = {}
    for i, layer in enumerate(net.layers):
        for b in layer.blobs:
            k = index.get(id(b))
            if k is not None and k not in final:
                final[k] = i  # first user in forward order = last in backward
    units, offset = [], 0
    for i in reversed(range(len(net.layers))):
        params = sorted(k for k, layer in final.items() if layer == i)
        if params:
            size = sum(int(net.learnable_params[k].count) for k in params)
            units.append(Unit(i, net.layers[i].name, params, offset, size))
            offset += size
    return units


def unit_sizes(units):
    """A picklable description of ``units``: ``[(layer, name, size), ...]`` (for the host side)."""
    return [(u.layer, u.name, u.size) for u in units]


def units_from_sizes(sizes):
    """Units (without parameter indices) from :func:`unit_sizes`; the host needs only offsets and sizes."""
    units, offset = [], 0
    for layer, name, size in sizes:
        units.append(Unit(layer, name, [], offset, size))
        offset += size
    return units


def make_chunks(units, chunk_size, tail=TAIL):
    """Group ``units`` (backward order) into chunks of ``chunk_size``; the last ``tail`` units alone.

    Returns a list of :class:`Chunk` (empty when there are no units); one of every unit where ``chunk_size`` is
    :data:`WHOLE`.
    """
    if chunk_size == WHOLE:
        return [Chunk(0, list(units))] if units else []
    chunk_size = max(1, int(chunk_size))
    n = len(units)
    head = max(0, n - tail)
    groups = [units[k:min(k + chunk_size, head)] for k in range(0, head, chunk_size)]
    groups += [[u] for u in units[head:]]
    return [Chunk(c, g) for c, g in enumerate(groups)]


def parse_chunk_size(value):
    """``3``, ``"3"`` -> 3; ``"auto"`` -> ``"auto"``; anything else raises ValueError."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    size = int(value)
    if size < 1:
        raise ValueError(f"chunk_size must be >= 1 or 'auto', got {value!r}")
    return size


class ChunkSearch:
    """The run-time search of ``chunk_size: auto``: hill-climbing on the mean iteration time.

    Starting at size ``start``, every ``interval`` iterations the mean iteration time of the interval is
    compared with the best so far; the size then grows by ``step``. After ``range`` tries in a row
    without improvement (or when the size passes ``max_size``) the best size is kept for good and logged.
    The first iteration of every interval is left out of the mean (it pays for the layout change).

    Args:
        max_size: the largest useful size (the number of units).
    """

    def __init__(self, max_size, interval=10, step=1, range=3, start=1):
        self.max_size, self.interval, self.step, self.range = max(1, max_size), max(2, interval), max(1, step), max(1, range)
        self.size = min(start, self.max_size)
        self.best_size, self.best_time = self.size, math.inf
        self.fails, self.done = 0, False
        self.times, self.tried = [], []

    def record(self, seconds):
        """Add one iteration time; returns the size to use from the next iteration on."""
        if self.done:
            return self.size
        self.times.append(seconds)
        if len(self.times) < self.interval:
            return self.size
        mean = sum(self.times[1:]) / (len(self.times) - 1)
        self.times = []
        self.tried.append((self.size, mean))
        if mean < self.best_time:
            self.best_size, self.best_time, self.fails = self.size, mean, 0
        else:
            self.fails += 1
        nxt = self.size + self.step
        if self.fails >= self.range or nxt > self.max_size:
            self.done, self.size = True, self.best_size
            log.info("Chunk size search: chose chunk_size %d (%.3f ms per iteration; tried %s)", self.size,
                     1000 * self.best_time, ", ".join(f"{s}: {1000 * t:.1f} ms" for s, t in self.tried))
        else:
            self.size = nxt
        return self.size
