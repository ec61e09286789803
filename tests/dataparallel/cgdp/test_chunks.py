"""Units, chunk grouping, the chunk-size search and the host accumulator (in process)."""
import numpy
import pytest

from layerforge.net import Net
from layerforge.dataparallel.cgdp.chunks import ChunkSearch, Unit, make_chunks, param_units, parse_chunk_size
from layerforge.dataparallel.cgdp.host import HostAccumulator, SharedUpdate, mean_into_slots, update_shares


def _ip(name, bottom, n, param=None):
    d = {"name": name, "type": "InnerProduct", "bottom": bottom, "top": name,
         "inner_product": {"num_output": n, "weight_filler": {"type": "gaussian"}}}
    if param:
        d["param"] = param
    return d


def test_units_in_backward_order_and_shared_parameters_final_at_first_user():
    net = Net({"name": "n", "layers": [
        {"name": "x", "type": "Input", "top": "x", "input": {"shape": [2, 3]}},
        _ip("a", "x", 3, [{"name": "w"}, {"name": "b"}]),
        {"name": "r", "type": "ReLU", "bottom": "a", "top": "a"},
        _ip("c", "a", 3, [{"name": "w"}, {"name": "b"}]),  # shares a's weights: final only after a
        _ip("d", "c", 2)]})
    units = param_units(net)
    assert [u.name for u in units] == ["d", "a"]
    assert [u.size for u in units] == [3 * 2 + 2, 3 * 3 + 3]
    assert [u.offset for u in units] == [0, 8]


def units(n, size=1):
    return [Unit(k, f"l{k}", [], k * size, size) for k in range(n)]


@pytest.mark.parametrize("n,size,tail,groups", [
    (6, 1, 2, [[0], [1], [2], [3], [4], [5]]),
    (6, 3, 2, [[0, 1, 2], [3], [4], [5]]),
    (7, 2, 2, [[0, 1], [2, 3], [4], [5], [6]]),
    (3, 5, 1, [[0, 1], [2]]),
    (2, 3, 2, [[0], [1]]),
    (0, 3, 2, []),
])
def test_make_chunks_groups_consecutive_units_and_keeps_the_tail_alone(n, size, tail, groups):
    chunks = make_chunks(units(n, 4), size, tail)
    assert [[u.layer for u in c.units] for c in chunks] == groups
    for c in chunks:
        assert c.offset == 4 * c.units[0].layer and c.size == 4 * len(c.units)


def test_parse_chunk_size():
    assert parse_chunk_size("AUTO") == "auto" and parse_chunk_size(3) == 3 and parse_chunk_size("2") == 2
    with pytest.raises(ValueError):
        parse_chunk_size(0)


def test_search_climbs_while_it_improves_then_stops_after_range_failures():
    search = ChunkSearch(max_size=10, interval=3, step=2, range=2)
    times = {1: 9.0, 3: 5.0, 5: 6.0, 7: 7.0}  # first iteration of each interval is ignored
    sizes = []
    for _ in range(20):
        size = search.size
        sizes.append(search.record(100.0 if len(search.times) == 0 else times[size]))
    assert search.done and search.size == 3
    assert [s for s, _ in search.tried] == [1, 3, 5, 7]
    assert sizes[-1] == 3


def test_search_stops_at_the_largest_size():
    search = ChunkSearch(max_size=2, interval=2, step=1, range=5)
    for t in (1, 1, 1, 0.5):
        search.record(t)
    assert search.done and search.size == 2


def _accumulator(G, sizes, chunk_size="auto", search=(2, 1, 1), combine=True):
    total = sum(sizes)
    slots, acc = numpy.zeros((G, total)), numpy.zeros(total)
    sent = []
    accumulator = HostAccumulator(slots, acc, [(10 - k, f"l{k}", n) for k, n in enumerate(sizes)], chunk_size,
                                  lambda g, msg: sent.append((g, msg)), search, threads=1, combine=combine)
    return accumulator, slots, acc, sent


def test_accumulator_of_replicas_that_combine_publishes_each_chunk_once_all_posted_and_writes_nothing():
    accumulator, slots, acc, sent = _accumulator(2, [2, 3], chunk_size=1, combine=False)
    slots[:] = numpy.arange(10.0).reshape(2, 5)
    accumulator.on_post(0, 0)
    accumulator.on_post(0, 1)
    assert sent == []  # worker 1 has posted nothing yet
    accumulator.on_post(1, 0)
    assert [(g, m[:2]) for g, m in sent] == [(0, ("ready", 0)), (1, ("ready", 0))]
    accumulator.on_post(1, 1)
    assert len(sent) == 4 and accumulator.accumulate_times == {}
    numpy.testing.assert_array_equal(slots, numpy.arange(10.0).reshape(2, 5))  # the replicas' own gradients


class _Param:
    def __init__(self, *shape):
        self.shape, self.count = shape, int(numpy.prod(shape))


@pytest.mark.parametrize("G", [2, 3, 4])
def test_replicas_combine_their_shares_to_the_bits_of_the_hosts_mean(G):
    """Every replica makes the mean of its share's blocks in its slot (the diffs its update reads): the same bits as
    the host's mean_into_slots, for every replica g (a row after the first two is summed through a scratch)."""
    params = [_Param(7, 3), _Param(5), _Param(11, 2, 2)]
    offsets, off = [], 0
    for p in params:
        offsets.append((off, p.count))
        off += p.count
    slots = numpy.random.default_rng(G).standard_normal((G, off)).astype(numpy.float32)
    expected = slots.copy()
    mean_into_slots(expected)
    shares = update_shares(params, G)
    for g in range(G):
        seam = SharedUpdate(shares[g], None, None, combine=(slots, g, offsets))
        for i, rows in shares[g].items():
            per_row = params[i].count // params[i].shape[0]
            lo, hi = (0, params[i].count) if rows is None else (rows.start * per_row, rows.stop * per_row)
            for start in range(lo, hi, 5):  # blocks of 5 values, as the solver's blocks cut a share
                seam.combine_gradient(i, (start, min(hi, start + 5)))
    owner = numpy.zeros(off, int)
    for g in range(G):
        for i, rows in shares[g].items():
            per_row = params[i].count // params[i].shape[0]
            lo, hi = (0, params[i].count) if rows is None else (rows.start * per_row, rows.stop * per_row)
            owner[offsets[i][0] + lo:offsets[i][0] + hi] = g
    combined = slots[owner, numpy.arange(off)]  # each value from the slot of the replica that updates it
    numpy.testing.assert_array_equal(combined, expected[0])


def test_accumulator_writes_the_mean_into_every_slot_when_all_workers_posted_including_empty_chunks():
    accumulator, slots, acc, sent = _accumulator(3, [2, 0, 3], chunk_size=1)
    slots[:] = numpy.arange(15.0).reshape(3, 5)
    mean = slots.mean(axis=0)
    for c in range(3):
        for g in range(3):
            accumulator.on_post(g, c)
    accumulator.pool.shutdown(wait=True)
    numpy.testing.assert_allclose(slots, numpy.stack([mean] * 3))
    assert sorted((g, m[1]) for g, m in sent) == [(g, c) for g in range(3) for c in range(3)]
    assert sum(1 for _, m in sent if m[2] is not None) == 0  # a fixed size never changes


@pytest.mark.parametrize("G,n", [(2, 5), (2, 100_003), (3, 70_001), (8, 20_000)])
def test_mean_into_slots_across_block_boundaries(G, n):
    slots = numpy.random.default_rng(G).standard_normal((G, n)).astype(numpy.float32)
    mean = slots.astype(numpy.float64).mean(axis=0)
    mean_into_slots(slots)
    for row in slots:
        numpy.testing.assert_allclose(row, mean, rtol=1e-5, atol=1e-6)


def test_accumulator_tells_workers_the_next_size_with_the_last_chunk():
    accumulator, slots, acc, sent = _accumulator(2, [1, 1, 1, 1, 1], search=(2, 2, 1))
    for _ in range(3):  # iterations: the first has no duration, the next two fill one interval
        for c in range(len(accumulator.chunks)):
            for g in range(2):
                accumulator.on_post(g, c)
        accumulator.pool.submit(lambda: None).result()
    accumulator.pool.shutdown(wait=True)
    announced = [m[2] for _, m in sent if m[2] is not None]
    assert announced == [3, 3]  # size 1 -> 3, told to both workers with the last ready
    assert len(accumulator.chunks) == 3  # [u0 u1 u2] + the two tail units
