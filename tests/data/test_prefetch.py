import itertools
import threading
import time

import pytest

from layerforge.data.prefetch import Prefetcher
from layerforge.errors import DataError


def test_results_in_order_and_bounded():
    produced = []

    def produce(i):
        produced.append(i)
        return i * i

    p = Prefetcher(produce, itertools.count(), depth=3)
    assert [p.get() for _ in range(10)] == [i * i for i in range(10)]
    time.sleep(0.2)
    assert len(produced) <= 10 + 3 + 1  # the queue holds at most `depth`, plus one being produced
    p.close()
    assert not p.alive


def test_close_stops_a_blocked_producer():
    p = Prefetcher(lambda i: i, itertools.count(), depth=1)
    time.sleep(0.05)
    before = threading.active_count()
    p.close()
    assert not p.alive and threading.active_count() == before - 1
    p.close()  # twice is fine


def test_data_error_reraised_in_consumer():
    def produce(i):
        if i == 2:
            raise DataError("db: key '00000002': corrupted record: bad magic")
        return i

    p = Prefetcher(produce, itertools.count(), name="mnist")
    assert [p.get(), p.get()] == [0, 1]
    with pytest.raises(DataError, match="^db: key '00000002': corrupted record: bad magic$"):
        p.get()
    assert not p.alive


def test_other_errors_become_data_errors_naming_the_source():
    def produce(i):
        raise ValueError("boom")

    p = Prefetcher(produce, [0], name="layer 'mnist'")
    with pytest.raises(DataError, match="^layer 'mnist': ValueError: boom$"):
        p.get()


def test_finite_jobs_then_stopped():
    p = Prefetcher(lambda i: i, [5])
    assert p.get() == 5
    with pytest.raises(DataError, match="the prefetch thread has stopped"):
        p.get()
