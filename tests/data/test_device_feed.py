"""DeviceFeed: batches in order, into the caller's arrays; on cupy one batch ahead, errors where they belong."""
import itertools

import numpy
import pytest

from layerforge.data.device_feed import DeviceFeed
from layerforge.errors import DataError


def source(read, bad=None):
    """Batch i: data (4, 3) all i (float32), labels [i, i + 1] (int64); batch ``bad`` raises a DataError."""
    for i in itertools.count():
        read.append(i)
        if i == bad:
            raise DataError(f"batch {i}: a bad record")
        yield (numpy.full((4, 3), i, numpy.float32), numpy.array([i, i + 1])), None


def test_batches_arrive_in_order_and_are_read_one_ahead_on_a_device(xp):
    read = []
    feed = DeviceFeed(xp, source(read))
    data, labels = xp.zeros((4, 3), xp.float64), xp.zeros(2, xp.float64)
    for i in range(5):
        feed.next_into([data, labels])
        numpy.testing.assert_array_equal(data.tolist(), numpy.full((4, 3), i))
        assert labels.tolist() == [i, i + 1]
        assert len(read) == i + (2 if feed.gpu else 1)
    if feed.gpu:
        assert feed.copy_stream != xp.cuda.get_current_stream()
    feed.close()


def test_fewer_outputs_than_arrays_take_the_first(xp):
    feed = DeviceFeed(xp, source([]))
    data = xp.zeros((4, 3), xp.float32)
    feed.next_into([data])
    feed.next_into([data])
    assert float(data.sum()) == 12.0
    feed.close()  # the next batch's copy is pending into buffers that go back to the pool


def test_a_read_error_comes_with_the_batch_that_needs_it(xp):
    read = []
    feed = DeviceFeed(xp, source(read, bad=2))
    data = xp.zeros((4, 3), xp.float32)
    feed.next_into([data])
    feed.next_into([data])  # on a device this call has already tried to read batch 2
    assert float(data[0, 0]) == 1.0 and read == ([0, 1, 2] if feed.gpu else [0, 1])
    with pytest.raises(DataError, match="batch 2: a bad record"):
        feed.next_into([data])
    feed.close()
