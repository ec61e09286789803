"""The convolution engines' shared workspaces: one process-wide arena per buffer role and dtype.

Nothing in a workspace outlives one forward or backward call, so, like Caffe's shared column buffer, every layer's
engines take their workspaces as views of one arena per role, grown to the largest request: the net pays for its
largest layer's workspace, not for the sum. On the host an arena also saves the page faults of fresh memory
(a 116 MB array of AlexNet conv2's Winograd products, allocated anew, took 12 ms more to write than a reused one).
"""
import math

_ARENAS = {}  # (array module name, role, dtype) -> flat array


def arena_bytes():
    """Bytes held by the shared workspace arenas."""
    return sum(int(a.nbytes) for a in _ARENAS.values())


def free_arenas():
    """Drop the shared arenas (the next call allocates again)."""
    _ARENAS.clear()


def arena(xp, role, shape, dtype):
    """An uninitialised array of ``shape`` and ``dtype``: a view of the ``role`` arena of ``xp`` (numpy or cupy),
    which grows to hold it. Two roles never share memory; two requests of one role do."""
    size = math.prod(shape)
    key = (xp.__name__, role, dtype.str)
    flat = _ARENAS.get(key)
    if flat is None or flat.size < size:
        flat = _ARENAS[key] = xp.empty(size, dtype=dtype)
    return flat[:size].reshape(shape)
