"""Host batches onto the device one batch ahead, copied on a CUDA stream of their own.

A data layer's forward on a GPU would otherwise copy its batch host-to-device on the compute stream, and
the iteration would wait for the copy. :class:`DeviceFeed` hands out the batch it staged during the
previous iteration and at once starts the next one's copy, which then runs while the device computes.
A batch crosses as it was read (an image batch as uint8 crops, a quarter of float32's bytes); ``finish``
turns it into the layer's tops on the device (mean, scale), with the same code that runs on the host.
"""
import numpy


def copy_arrays(xp, arrays, extra, outs):
    """The default ``finish``: each output gets the batch array of its place."""
    for out, array in zip(outs, arrays):
        out[...] = array


class DeviceFeed:
    """Batches from an iterator of host batches into arrays of ``xp``'s device.

    Args:
        xp: numpy or cupy.
        batches: yields ``(arrays, extra)``: a tuple of numpy arrays, which cross to the device, and any
            host-side value (a batch's crop offsets) handed to ``finish`` as it is.
        finish: ``finish(xp, arrays, extra, outs)`` fills the outputs from a batch's arrays of ``xp``;
            by default :func:`copy_arrays`.

    numpy: :meth:`next_into` takes one batch from ``batches`` and finishes it into the outputs.
    cupy: :meth:`next_into` finishes the batch staged by the previous call (the compute stream first waits
    for that batch's host-to-device copy) and then stages the following batch: its arrays go into
    page-locked host buffers and an asynchronous copy on a non-blocking stream moves them to device
    buffers. Two slots alternate, and events order the streams: a slot's device buffers are overwritten
    only after the compute stream has copied them out, its host buffers only after their last copy ended.
    The iterator is thus read one batch ahead; an error raised while reading ahead surfaces at the call
    that needs that batch.
    """

    def __init__(self, xp, batches, finish=copy_arrays):
        self.xp, self.batches, self.finish = xp, iter(batches), finish
        self.gpu = xp.__name__ == "cupy"
        self.staged = self.error = None
        if self.gpu:
            self.copy_stream = xp.cuda.Stream(non_blocking=True)
            self.slots = [_Slot(xp), _Slot(xp)]
            self.turn = 0

    def next_into(self, outs):
        """Fill ``outs`` (arrays of ``xp``) from the next batch with ``finish``."""
        if not self.gpu:
            arrays, extra = next(self.batches)
            self.finish(self.xp, arrays, extra, outs)
            return
        if self.staged is None and self.error is None:  # a read error already waiting is this call's
            self._stage()
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        slot, stream = self.staged, self.xp.cuda.get_current_stream()
        stream.wait_event(slot.copied)
        self.finish(self.xp, slot.device, slot.extra, outs)
        slot.consumed.record(stream)
        self._stage()

    def _stage(self):
        try:
            batch, extra = next(self.batches)
        except Exception as e:  # noqa: BLE001 - raised by next_into when this batch is asked for
            self.staged, self.error = None, e
            return
        batch = [numpy.asarray(a) for a in batch]
        slot = self.slots[self.turn]
        self.turn ^= 1
        slot.copied.synchronize()  # the host buffers' previous copy has finished
        if slot.fit(batch):  # new device buffers come from the compute stream's pool: wait for its earlier work
            self.copy_stream.wait_event(self.xp.cuda.get_current_stream().record())
        for host, array in zip(slot.host, batch):
            host[...] = array
        self.copy_stream.wait_event(slot.consumed)
        for device, host in zip(slot.device, slot.host):
            device.set(host, stream=self.copy_stream)
        slot.copied.record(self.copy_stream)
        slot.extra, self.staged = extra, slot

    def close(self):
        """Drop the staged batch and close the iterator (a generator's ``finally`` runs)."""
        if self.gpu:  # the slots' buffers go back to the pool: no copy may still be writing them
            self.copy_stream.synchronize()
        self.staged = self.error = None
        close = getattr(self.batches, "close", None)
        if close is not None:
            close()


class _Slot:
    """One staged batch: page-locked host buffers, device buffers, and the events that order their reuse."""

    def __init__(self, xp):
        self.xp, self.host, self.device, self.extra = xp, [], [], None
        self.copied, self.consumed = xp.cuda.Event(disable_timing=True), xp.cuda.Event(disable_timing=True)

    def fit(self, batch):
        """(Re)allocate the buffers when the batch's shapes or dtypes differ from the last one's; True if so."""
        import cupyx

        if [(a.shape, a.dtype) for a in self.host] == [(a.shape, a.dtype) for a in batch]:
            return False
        self.host = [cupyx.empty_pinned(a.shape, a.dtype) for a in batch]
        self.device = [self.xp.empty(a.shape, a.dtype) for a in batch]
        return True
