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
