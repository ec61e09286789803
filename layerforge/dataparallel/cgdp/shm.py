"""The shared host buffers of a node: ``slots`` (G x P partial gradients), ``acc`` (P), ``params`` (P)."""
from multiprocessing import resource_tracker, shared_memory

import numpy

KINDS = ("slots", "acc", "params")


def _shape(kind, G, total):
    return (G, total) if kind == "slots" else (total,)


class Buffers(dict):
    """``{kind: numpy array over shared memory}``; :meth:`close` detaches (and unlinks, for the creator)."""

    def __init__(self, segments, arrays, owner):
        super().__init__(arrays)
        self.segments, self.owner = segments, owner
        self.names = {k: s.name for k, s in segments.items()}

    def close(self):
        self.clear()  # drop the array views before closing the mappings under them
        for s in self.segments.values():
            try:
                s.close()
                if self.owner:
                    s.unlink()
            except (FileNotFoundError, BufferError):
                pass


def create(G, total, dtype):
    """New zeroed buffers for G workers and P = ``total`` values of ``dtype``."""
    dtype = numpy.dtype(dtype)
    segments, arrays = {}, {}
    for kind in KINDS:
        shape = _shape(kind, G, total)
        nbytes = max(1, int(numpy.prod(shape)) * dtype.itemsize)
        segments[kind] = shared_memory.SharedMemory(create=True, size=nbytes)
        arrays[kind] = numpy.ndarray(shape, dtype, buffer=segments[kind].buf)
        arrays[kind][...] = 0
    return Buffers(segments, arrays, owner=True)


def attach(names, G, total, dtype):
    """The buffers ``create`` made, by name (in a worker)."""
    dtype = numpy.dtype(dtype)
    segments, arrays = {}, {}
    # Python < 3.13 registers attached segments with the resource tracker as if this process owned them
    # (a tracker of its own would unlink them when the worker exits); only the parent owns them
    register, resource_tracker.register = resource_tracker.register, lambda name, rtype: None
    try:
        for kind in KINDS:
            segments[kind] = shared_memory.SharedMemory(name=names[kind])
    finally:
        resource_tracker.register = register
    for kind in KINDS:
        arrays[kind] = numpy.ndarray(_shape(kind, G, total), dtype, buffer=segments[kind].buf)
    return Buffers(segments, arrays, owner=False)
