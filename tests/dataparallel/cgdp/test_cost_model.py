"""The cost model's Definitions 3.1-3.4 on hand-worked cases (docs/cgdp.md)."""
import numpy
import pytest

from layerforge.dataparallel.cgdp.cost_model import CostModel, Rates, from_stats, measure_rates
from layerforge.dataparallel.cgdp.transfer import Mover

# 0.01 s per value copied each way, 0.035 s per value per slot combined on the host (0.07 n at G = 2),
# 0.05 s per value per slot the tree root adds, 0.02 s per value it scales, parameters 0.01 s out, 0.02 s in
RATES = Rates(copy_out=0.01, copy_back=0.01, host_combine=0.035, root_add=0.05, root_scale=0.02, param_out=0.01,
              param_in=0.02)


def model(**kw):
    # two units (backward order): 1 s then 2 s of backward, 10 and 20 values
    args = dict(forward=3.0, backward=[1.0, 2.0], sizes=[10, 20], update=0.5, rates=RATES, lam=0.0)
    args.update(kw)
    return CostModel(**args)


def test_host_overlap_hides_all_but_the_last_chunk():
    m = model()
    # G = 2: a_c = n * 0.07. chunk 1: ready 1, out 1.1, acc 1.8, back 1.9
    # chunk 2: ready 3, out 3.2, acc 3.2 + 1.4 = 4.6, back 4.8 -> E = 4.8 - 3 = 1.8
    assert m.exposed(2) == pytest.approx(1.8)
    assert m.host(2) == pytest.approx(3 + 3 + 1.8 + 0.5)


def test_host_combine_grows_with_the_slots():
    # G = 4: a_c = 4 * 0.035 n = 0.14 n. chunk 1: out 1.1, acc 2.5, back 2.6;
    # chunk 2: out 3.2, acc 3.2 + 2.8 = 6.0, back 6.2 -> E = 3.2
    assert model().exposed(4) == pytest.approx(3.2)


def test_shared_memory_workers_copy_nothing():
    m = model(rates=RATES._replace(copy_out=0.0, copy_back=0.0))
    # chunk 1: ready 1, acc 1.7; chunk 2: ready 3, acc 3 + 1.4 = 4.4 -> E = 1.4
    assert m.exposed(2) == pytest.approx(1.4)
    # G = 1: nothing to combine, the copies remain: chunk 2 out 3.2, back 3.4 -> E = 0.4
    assert model(rates=RATES._replace(host_combine=1.0)).exposed(1) == pytest.approx(0.4)


def test_one_chunk_waits_for_the_end_of_backward():
    m = model(tail=0)
    assert m.chunks(2) == [(3.0, 30)]
    # ready 3, out 3.3, acc 3.3 + 30 * 0.07 = 5.4, back 5.7 -> E = 2.7
    assert m.exposed(2, chunk_size=2) == pytest.approx(2.7)


def test_tail_units_stay_alone_so_chunk_size_two_changes_nothing_here():
    assert model().chunks(2) == [(1.0, 10), (2.0, 20)]


def test_latency_is_paid_per_chunk():
    # chunk 1's latency hides under chunk 2's backward; chunk 2's is exposed
    assert model(lam=0.1).exposed(2) == pytest.approx(1.8 + 0.1)


def test_tree_definition():
    m = model()
    # gradients out 30 * 0.01 = 0.3; root: 30 * (1 * 0.05 + 0.02) = 2.1; parameters out and in 30 * 0.03 = 0.9
    assert m.tree(2) == pytest.approx(3 + 3 + 0.3 + 2.1 + 0.9 + 0.5)
    # G = 4: the root adds three slots: 30 * (3 * 0.05 + 0.02) = 5.1
    assert m.tree(4) == pytest.approx(3 + 3 + 0.3 + 5.1 + 0.9 + 0.5)
    p = m.predict(2)
    assert p["winner"] == "host" and p["ratio"] == pytest.approx(9.8 / 8.3)


def test_speedup_and_growth_with_G():
    m = model(rates=Rates(*[0.0] * len(Rates._fields)))
    assert m.speedup(4) == pytest.approx(4.0) and m.speedup(8, "tree") == pytest.approx(8.0)
    m = model()
    assert m.tree(8) > m.tree(4) > m.tree(2)
    assert m.best_chunk_size(2) in (1, 2)


def test_from_stats_reads_per_unit_times():
    stats = {"G": 2, "units": [(6, "ip2", 10), (2, "ip1", 20)],
             "layer_backward_ms": {7: 500.0, 6: 500.0, 4: 1000.0, 2: 1000.0, 0: 0.0},
             "phases_ms": {"forward": 3000.0, "update": 500.0}, "rates": RATES._asdict(), "latency_s": 0.0}
    m = from_stats(stats)
    assert m.b == [1.0, 2.0] and m.n == [10, 20] and m.rates == RATES
    assert m.host(2) == pytest.approx(model().host(2))
    # another run's compute phases replace F, B and U; B scales the per-layer times
    m = from_stats(stats, {"forward": 1000.0, "backward": 6000.0, "update": 250.0})
    assert (m.F, m.U, m.b) == (1.0, 0.25, [2.0, 4.0])


class _Param:
    def __init__(self, n):
        self.data, self.diff = numpy.zeros(n, numpy.float32), numpy.ones(n, numpy.float32)


@pytest.mark.parametrize("attached", [False, True])
def test_measure_rates_times_each_operation(attached):
    params = [_Param(300_000), _Param(100_000)]
    mover = Mover(params, [(0, 300_000), (300_000, 100_000)])
    slots = numpy.arange(3 * 400_000, dtype=numpy.float32).reshape(3, 400_000)
    acc = numpy.zeros(400_000, numpy.float32)
    if attached:  # as a CPU worker: its diffs are slot 0, so gradients are never copied
        mover.attach_diffs(slots[0])
    rates = Rates(**measure_rates(params, mover, slots, acc, numpy))
    copies = rates[:2]
    assert all(r == 0.0 for r in copies) if attached else all(1e-12 < r < 1e-6 for r in copies)
    assert all(1e-12 < r < 1e-6 for r in rates[2:])  # seconds per value: memory speed, not zero, not absurd
    assert measure_rates([], Mover([], []), slots[:, :0], acc[:0], numpy) is None


def test_attached_diffs_are_the_slot():
    params = [_Param(6), _Param(4)]
    params[0].diff = numpy.arange(6, dtype=numpy.float32).reshape(2, 3)
    mover = Mover(params, [(0, 6), (6, 4)])
    slot, other = numpy.zeros(10, numpy.float32), numpy.zeros(10, numpy.float32)
    assert mover.attach_diffs(slot)
    numpy.testing.assert_array_equal(slot, [0, 1, 2, 3, 4, 5, 1, 1, 1, 1])  # values kept
    params[1].diff += 1
    assert slot[6:].tolist() == [2, 2, 2, 2] and params[0].diff.shape == (2, 3)
    mover.to_host([0, 1], slot)  # nothing to copy
    mover.to_host([0, 1], other)  # another buffer is a real copy
    numpy.testing.assert_array_equal(other, slot)
