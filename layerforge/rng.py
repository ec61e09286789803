"""The one random stream of a process: fillers, Dropout, data shuffling and mirroring draw from it.

Keeping it in one place makes a run reproducible from ``random_seed`` and lets a snapshot save and
restore it exactly (``get_state`` / ``set_state``).
"""
import numpy

_generator = numpy.random.default_rng(0)


def seed(value):
    """Reset the stream to a known state (``value`` a non-negative int)."""
    global _generator
    _generator = numpy.random.default_rng(int(value))


def get_rng():
    """The process-wide ``numpy.random.Generator``."""
    return _generator


def get_state():
    """The stream's state as a JSON-able dict (store it in snapshots)."""
    return _generator.bit_generator.state


def set_state(state):
    """Restore a state returned by :func:`get_state`."""
    _generator.bit_generator.state = state


def batch_draw(draw, shape, split=None):
    """``draw(shape)``: random values per sample of a batch (axis 0 of ``shape``), such as Dropout's mask.

    ``split=(index, count)`` (a replica computing samples ``index, index + count, ...`` of the whole batch, as the
    data layers' shards deal them, layerforge.net.Net's ``split``): those rows of ``draw`` over the whole batch,
    so the replica's samples get the values one process with the whole batch draws for them, and its stream
    advances as that process's does.
    """
    if split is None or split[1] == 1:
        return draw(shape)
    index, count = split
    return draw((shape[0] * count,) + tuple(shape[1:]))[index::count]
