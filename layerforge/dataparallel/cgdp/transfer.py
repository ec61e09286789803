"""Moving parameter diffs between a replica's arrays and flat shared host buffers.

On the CPU a replica's diffs can *be* its slot of the shared buffer (:meth:`Mover.attach_diffs`): backward
writes the gradients straight into shared memory, and the host's mean lands in the diffs without a copy;
``to_host``/``to_device`` on the attached buffer then have nothing to do. On a GPU (cupy) the copies run
on a separate stream, ordered after the compute stream through an event recorded when the layer's
backward was issued, into host memory registered as pinned when possible: the device goes on with the
next layers while the copy engine moves the chunk.
"""
import numpy

from ...backend import get_array_module
from ...blob import pack_data, pack_diffs


class Mover:
    """Copies between blobs and flat host segments; ``offsets[k] = (offset, count)`` of learnable param k.

    ``host_memory``: the replica's arrays are host memory, so they can *be* views of the shared buffers.
    """

    host_memory = True

    def __init__(self, params, offsets):
        self.params, self.offsets = params, offsets
        self.attached = None

    def attach_diffs(self, flat):
        """Make every diff a view of its segment of ``flat`` (current values kept); returns True."""
        pack_diffs(self.params, flat, self.offsets)
        self.attached = flat.__array_interface__["data"][0]
        return True

    def attach_params(self, flat, keep=()):
        """Make every parameter's data a view of its segment of ``flat``, whose values it takes (no copy), except
        the parameters whose indices are in ``keep``."""
        pack_data(self.params, flat, self.offsets, keep)

    def history_views(self, history, rows):
        """Views of the segments of ``rows`` shaped as the solver's ``history`` arrays (Caffe's layout: row k holds
        the k-th state array of every parameter), for the solver to keep its state in (no copy)."""
        views = []
        for j, h in enumerate(history):
            off, n = self.offsets[j % len(self.params)]
            views.append(rows[j // len(self.params), off:off + n].reshape(h.shape))
        return views

    def _is_attached(self, flat):
        return self.attached is not None and flat.__array_interface__["data"][0] == self.attached

    def mark(self):
        """A token the copy thread waits on before reading diffs written so far (None on the CPU)."""
        return None

    def to_host(self, indices, flat, token=None):
        """Copy the diffs of params ``indices`` into their segments of ``flat``."""
        if self._is_attached(flat):
            return
        for k in indices:
            off, n = self.offsets[k]
            numpy.copyto(flat[off:off + n], self.params[k].diff.reshape(-1))

    def to_device(self, indices, flat):
        """Copy the segments of ``flat`` into the diffs of params ``indices``."""
        if self._is_attached(flat):
            return
        for k in indices:
            off, n = self.offsets[k]
            d = self.params[k].diff
            numpy.copyto(d, flat[off:off + n].reshape(d.shape))

    def synchronize(self):
        pass

    def close(self):
        """Let go of what the mover holds on the host buffers (before they are unmapped)."""

    def params_to_host(self, flat):
        for k, (off, n) in enumerate(self.offsets):
            flat[off:off + n] = numpy.asarray(self.params[k].data).reshape(-1)

    def params_from_host(self, flat):
        for k, (off, n) in enumerate(self.offsets):
            d = self.params[k].data
            d[...] = numpy.asarray(flat[off:off + n]).reshape(d.shape)


class CupyMover(Mover):
    """The GPU variant: a copy stream per replica, events from the compute stream, pinned host buffers."""

    host_memory = False

    def __init__(self, params, offsets, buffers=()):
        super().__init__(params, offsets)
        import cupy

        self.cupy = cupy
        self.device = cupy.cuda.Device()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.registered = []
        for buf in buffers:  # page-locked host memory makes the copies asynchronous and faster
            try:
                cupy.cuda.runtime.hostRegister(buf.ctypes.data, buf.nbytes, 0)
                self.registered.append(buf.ctypes.data)
            except Exception:  # noqa: BLE001 - pinning is an optimisation only
                pass

    def mark(self):
        ev = self.cupy.cuda.Event(disable_timing=True)
        ev.record(self.cupy.cuda.get_current_stream())
        return ev

    def to_host(self, indices, flat, token=None):
        with self.device, self.stream:
            if token is not None:
                self.stream.wait_event(token)
            for k in indices:
                off, n = self.offsets[k]
                self.params[k].diff.reshape(-1).get(stream=self.stream, out=flat[off:off + n], blocking=False)
            self.stream.synchronize()

    def attach_diffs(self, flat):
        return False  # device memory: the chunks are copied

    def to_device(self, indices, flat):
        with self.device, self.stream:
            for k in indices:
                off, n = self.offsets[k]
                self.params[k].diff.reshape(-1).set(flat[off:off + n], stream=self.stream)

    def synchronize(self):
        self.stream.synchronize()

    def close(self):
        self.stream.synchronize()
        while self.registered:
            self.cupy.cuda.runtime.hostUnregister(self.registered.pop())

    def params_to_host(self, flat):
        for k, (off, n) in enumerate(self.offsets):
            flat[off:off + n] = self.params[k].data.reshape(-1).get()

    def params_from_host(self, flat):
        for k, (off, n) in enumerate(self.offsets):
            self.params[k].data.reshape(-1).set(flat[off:off + n])


def make_mover(net, offsets, buffers=()):
    """The Mover for ``net``'s array module."""
    params = net.learnable_params
    xp = get_array_module(*[p.data for p in params]) if params else numpy
    return Mover(params, offsets) if xp is numpy else CupyMover(params, offsets, buffers)
