"""The shared host buffers of a node: ``slots`` (G x P partial gradients), ``acc`` (P), ``params`` (P) and
``history`` (H x P: the update rule's H history arrays per parameter, shared by CPU replicas in host mode).

New shared memory is zero-filled by the system, and a page is resident only once it is written: a buffer a
mode does not use (``acc`` on one node, ``history`` in tree mode) costs no memory."""
from multiprocessing import resource_tracker, shared_memory

import numpy

from ...errors import deferring_interrupts

KINDS = ("slots", "acc", "params", "history")


def _shape(kind, G, total, history_rows):
    return {"slots": (G, total), "history": (history_rows, total)}.get(kind, (total,))


class Buffers(dict):
    """``{kind: numpy array over shared memory}``; :meth:`close` detaches (and unlinks, for the creator)."""

    def __init__(self, segments, arrays, owner):
        super().__init__(arrays)
        self.segments, self.owner = segments, owner
        self.names = {k: s.name for k, s in segments.items()}

    def close(self):
        self.clear()  # drop the array views before closing the mappings under them
        with deferring_interrupts():  # a name unlinked but still the resource tracker's is a "leaked" one to it
            for s in self.segments.values():
                if self.owner:  # before the close: a view still held elsewhere (BufferError) keeps only the mapping
                    try:
                        s.unlink()
                    except FileNotFoundError:
                        pass
                try:
                    s.close()
                except BufferError:
                    pass


def create(G, total, dtype, history_rows=1):
    """New zeroed buffers for G workers, P = ``total`` values of ``dtype`` and ``history_rows`` history arrays.
    The caller records them for their :meth:`Buffers.close` within errors.deferring_interrupts: a signal raised
    in between would leave their names behind."""
    dtype = numpy.dtype(dtype)
    segments, arrays = {}, {}
    try:
        for kind in KINDS:
            shape = _shape(kind, G, total, history_rows)
            nbytes = max(1, int(numpy.prod(shape)) * dtype.itemsize)
            segments[kind] = shared_memory.SharedMemory(create=True, size=nbytes)  # zero-filled, see above
            arrays[kind] = numpy.ndarray(shape, dtype, buffer=segments[kind].buf)
    except BaseException:  # /dev/shm full after some were made: those must not outlive the error
        arrays.clear()
        Buffers(segments, arrays, owner=True).close()
        raise
    return Buffers(segments, arrays, owner=True)


def attach(names, G, total, dtype, history_rows=1):
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
        arrays[kind] = numpy.ndarray(_shape(kind, G, total, history_rows), dtype, buffer=segments[kind].buf)
    return Buffers(segments, arrays, owner=False)
