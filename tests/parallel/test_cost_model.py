"""The cost model's Definitions 3.1-3.4 on hand-worked cases (docs/cgdp.md)."""
import pytest

from layerforge.parallel.cost_model import CostModel, from_stats


def model(**kw):
    # two units (backward order): 1 s then 2 s of backward, 10 and 20 values; 0.01 s per value copied;
    # t_acc such that a_c(G=1) = n * 0.04
    args = dict(forward=3.0, backward=[1.0, 2.0], sizes=[10, 20], update=0.5, t_copy=0.01, t_acc=0.04, lam=0.0)
    args.update(kw)
    return CostModel(**args)


def test_host_overlap_hides_all_but_the_last_chunk():
    m = model()
    # G = 2: a_c = n * 0.04 * 7 / 4 = 0.07 n. chunk 1: ready 1, out 1.1, acc 1.8, back 1.9
    # chunk 2: ready 3, out 3.2, acc 3.2 + 1.4 = 4.6, back 4.8 -> E = 4.8 - 3 = 1.8
    assert m.exposed(2) == pytest.approx(1.8)
    assert m.host(2) == pytest.approx(3 + 3 + 1.8 + 0.5)


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
    # 3 n t_copy = 0.9; root sum n t_acc (3G - 1) / 4 = 30 * 0.04 * 5 / 4 = 1.5
    assert m.tree(2) == pytest.approx(3 + 3 + 0.9 + 1.5 + 0.5)
    p = m.predict(2)
    assert p["winner"] == "host" and p["ratio"] == pytest.approx(8.9 / 8.3)


def test_speedup_and_growth_with_G():
    m = model(t_copy=0.0, t_acc=0.0)
    assert m.speedup(4) == pytest.approx(4.0) and m.speedup(8, "tree") == pytest.approx(8.0)
    m = model()
    assert m.tree(8) > m.tree(4) > m.tree(2)
    assert m.best_chunk_size(2) in (1, 2)


def test_from_stats_reads_per_unit_times():
    stats = {"G": 2, "units": [(6, "ip2", 10), (2, "ip1", 20)],
             "layer_backward_ms": {7: 500.0, 6: 500.0, 4: 1000.0, 2: 1000.0, 0: 0.0},
             "chunks_ms": {"copy_out:ip2": 100.0, "copy_back:ip2": 100.0, "copy_out:ip1": 200.0,
                           "copy_back:ip1": 200.0, "accumulate:ip2": 700.0, "accumulate:ip1": 1400.0},
             "phases_ms": {"forward": 3000.0, "update": 500.0}}
    m = from_stats(stats)
    assert m.b == [1.0, 2.0] and m.n == [10, 20]
    assert m.t_copy == pytest.approx(0.01) and m.t_acc == pytest.approx(0.04)
