"""InputStats: rates and shares over a window, sums over layers, and the input-bound rule."""
import time
import types

import pytest

from layerforge.data import input_stats
from layerforge.data.input_stats import INPUT_BOUND_SHARE, InputStats


def window(seconds, batches, images, wait_s, decoded=0, decode_s=0.0, workers=2):
    stats = InputStats(workers)
    stats.batches, stats.images, stats.wait_s, stats.decoded, stats.decode_s = batches, images, wait_s, decoded, decode_s
    stats.started = time.perf_counter() - seconds
    return stats


def test_rates_and_shares(monkeypatch):
    # the stats' clock stands still, so that a loaded machine's milliseconds between the lines cannot move the rate
    now = time.perf_counter()
    monkeypatch.setattr(input_stats, "time", types.SimpleNamespace(perf_counter=lambda: now))
    stats = window(2.0, 10, 640, 0.1, decoded=704, decode_s=1.1)
    assert stats.rate == pytest.approx(320, rel=0.01)
    assert stats.wait_share == pytest.approx(0.05, rel=0.01)
    assert stats.capacity == pytest.approx(704 * 2 / 1.1)
    assert stats.summary() == ("input 320 img/s, waited 10.0 ms per batch (5.0% of the time); 2 decode workers "
                               "could deliver 1,280 img/s")
    stats.workers = 1
    assert stats.summary().endswith("; 1 decode worker could deliver 640 img/s")
    stats.reset()
    assert (stats.batches, stats.images, stats.wait_s, stats.capacity) == (0, 0, 0.0, 0.0) and stats.elapsed_s < 1


def test_sum_of_layers():
    total = window(2.0, 10, 640, 0.1, 704, 1.1) + window(1.0, 10, 320, 0.3, 330, 0.5, workers=1)
    assert (total.batches, total.images, total.decoded, total.workers) == (20, 960, 1034, 3)
    assert total.wait_s == pytest.approx(0.4) and total.elapsed_s == pytest.approx(2.0, abs=0.05)


@pytest.mark.parametrize("wait_s, bound", [(0.05, False), (INPUT_BOUND_SHARE * 1.0 - 0.01, False), (0.5, True)])
def test_input_bound_when_the_loop_waits_more_than_a_tenth_of_the_time(wait_s, bound):
    stats = window(1.0, 10, 640, wait_s, decoded=640, decode_s=1.6)
    assert stats.input_bound() is bound
    assert (stats.warning() is not None) is bound
    if bound:
        assert stats.warning().startswith("training is input-bound: it waited for its batches 50% of the time; "
                                          "2 decode workers deliver at most 800 img/s")
    assert not InputStats().input_bound()  # nothing handed out yet


def test_a_replica_s_shard_is_given_as_the_whole_batch():
    """A replica of a split batch counts its shard; the line gives the replicas' together, as the display's img/s."""
    stats = window(2.0, 10, 640, 0.1, decoded=704, decode_s=1.1)
    assert stats.summary(replicas=2) == ("input 640 img/s (2 replicas' shards), waited 10.0 ms per batch (5.0% of the "
                                         "time); 4 decode workers could deliver 2,560 img/s")
