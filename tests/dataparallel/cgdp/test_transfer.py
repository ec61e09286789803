"""The movers of host mode (layerforge/dataparallel/cgdp/transfer.py) on the CPU and on a device.

The device scenarios leave the compute stream's work queued, as training does between two host reads: a copy
that is not ordered after it reads the gradients of the iteration before (on the emulated device every time,
whatever LAYERFORGE_EMULATED_GPU_SEED, since nothing else runs that work), a copy out that ``to_host`` does not
wait for is not in the host buffer when the host reads it, and a copy still queued when the mover lets go of the
host buffers never arrives whole.
"""
import types

import numpy
import pytest

from layerforge.blob import Blob
from layerforge.dataparallel.cgdp.transfer import make_mover

SHAPES = [[(3, 4), (5,)], [(2, 3, 2), (1,), (4, 1)]]


def _mover(xp, shapes, slot):
    params = [Blob(shape, numpy.float32, xp) for shape in shapes]
    sizes = [int(numpy.prod(shape)) for shape in shapes]
    offsets = list(zip(numpy.cumsum([0] + sizes[:-1]).tolist(), sizes))
    return params, make_mover(types.SimpleNamespace(learnable_params=params), offsets, (slot,))


def _settle(xp):
    """The device's queued work done, as after a host read of the loss."""
    if xp is not numpy:
        xp.cuda.Device().synchronize()


@pytest.mark.parametrize("shapes", SHAPES)
def test_a_chunk_copied_out_holds_the_gradients_backward_wrote_before_its_mark(xp, shapes):
    slot = numpy.zeros(sum(int(numpy.prod(s)) for s in shapes), numpy.float32)
    params, mover = _mover(xp, shapes, slot)
    for p in params:
        p.diff[...] = 1  # the iteration before
    _settle(xp)
    for k, p in enumerate(params):  # this iteration's backward, queued on the compute stream
        diff = p.diff
        diff *= k + 2
    expected = numpy.concatenate([numpy.full(int(numpy.prod(s)), k + 2, numpy.float32) for k, s in enumerate(shapes)])
    try:
        mover.to_host(range(len(params)), slot, mover.mark())  # HostSync's copy thread, with the layer's token
        numpy.testing.assert_array_equal(slot, expected)  # in host memory on return: the host adds it up next
    finally:
        mover.close()


@pytest.mark.parametrize("shapes", SHAPES)
def test_a_mover_closed_with_copies_back_queued_leaves_the_gradients_whole(xp, shapes):
    """A run that stops between the chunks' copy-back (HostSync._ready) and before_update's wait for them: close
    lets go of the host buffers, which are then unmapped (shm.Buffers.close) and their memory another's."""
    total = sum(int(numpy.prod(s)) for s in shapes)
    slot = numpy.arange(1, total + 1, dtype=numpy.float32)  # the mean the host published
    params, mover = _mover(xp, shapes, slot)
    _settle(xp)
    mover.to_device(range(len(params)), slot)
    mover.close()
    slot[...] = -1  # the memory under the buffers, no longer the mover's
    _settle(xp)
    got = numpy.concatenate([numpy.asarray(p.diff.get() if xp is not numpy else p.diff).reshape(-1) for p in params])
    numpy.testing.assert_array_equal(got, numpy.arange(1, total + 1, dtype=numpy.float32))
