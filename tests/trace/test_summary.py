"""``trace summary``'s figures equal what a hand-built trace's spans say (times in microseconds below)."""
import pytest

from layerforge.trace.summary import summarize, union_length

COMPUTE, COMM, DATA = 1, 2, 3


def X(pid, tid, cat, name, ts, end, k=None, **args):
    if k is not None:
        args["iter"] = k
    return {"ph": "X", "pid": pid, "tid": tid, "cat": cat, "name": name, "ts": float(ts), "dur": float(end - ts),
            "args": args}


def metadata(pids):
    out = []
    for pid in pids:
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}})
        for tid, row in ((COMPUTE, "compute"), (COMM, "comm"), (DATA, "data")):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": row}})
    return out


def two_ranks():
    """Iteration 0: rank 1 is slower (its input and its update take longer), iteration 1: rank 0 is (it runs its
    allreduce on the compute thread, exposed in full, while rank 1's overlaps backward)."""
    c, m, d = COMPUTE, COMM, DATA
    events = [
        # rank 0, iteration 0: waits 50 us of a 400 us exchange
        X(0, c, "iteration", "iteration", 0, 1000, 0),
        X(0, c, "data", "data", 0, 100, 0),
        X(0, d, "data", "decode", 0, 700, 0),  # the prefetch thread: no wait of the compute thread
        X(0, c, "forward", "conv1", 100, 300, 0, type="Convolution"),
        X(0, c, "forward", "conv1", 120, 200, 0, trial="IM2COL"),  # AUTO's trial inside the layer's span
        X(0, c, "forward", "ip1", 300, 400, 0, type="InnerProduct"),
        X(0, c, "backward", "ip1", 400, 500, 0),
        X(0, c, "backward", "conv1", 500, 800, 0),
        X(0, m, "comm", "bucket 0", 450, 650, 0),
        X(0, m, "comm", "bucket 1", 600, 850, 0),  # overlaps bucket 0: comm is their union, 450-850
        X(0, c, "comm", "wait", 800, 850, 0),
        X(0, c, "update", "sgd", 850, 950, 0),
        # rank 1, iteration 0: a slow input (300), exchange 650-950 of which 20 exposed
        X(1, c, "iteration", "iteration", 0, 1000, 0),
        X(1, c, "data", "data", 0, 300, 0),
        X(1, c, "forward", "conv1", 300, 500, 0, type="Convolution"),
        X(1, c, "forward", "ip1", 500, 600, 0, type="InnerProduct"),
        X(1, c, "backward", "ip1", 600, 700, 0),
        X(1, c, "backward", "conv1", 700, 900, 0),
        X(1, m, "comm", "bucket 0", 650, 950, 0),
        X(1, c, "comm", "wait", 900, 920, 0),
        X(1, c, "update", "sgd", 920, 1000, 0),
        # iteration 1: rank 0 allreduces on its compute thread (100, all exposed), rank 1 waits 400 of 500
        X(0, c, "iteration", "iteration", 2000, 3000, 1),
        X(0, c, "forward", "conv1", 2000, 2400, 1),
        X(0, c, "comm", "bucket 0", 2800, 2900, 1),
        X(1, c, "iteration", "iteration", 2000, 3000, 1),
        X(1, c, "forward", "conv1", 2000, 2300, 1),
        X(1, m, "comm", "bucket 0", 2400, 2900, 1),
        X(1, c, "comm", "wait", 2500, 2900, 1),
    ]
    return {"traceEvents": metadata([0, 1]) + events}


def test_union_length():
    assert union_length([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4
    assert union_length([]) == 0


def test_per_rank_figures():
    result = summarize(two_ranks())
    assert result["iterations"] == [0, 1]
    r0, r1 = result["ranks"]
    assert (r0["name"], r1["name"], r0["iterations"]) == ("rank 0", "rank 1", 2)
    ms = pytest.approx
    # rank 0: comm (400 + 100) / 2, exposed (50 + 100) / 2, data wait (100 + 0) / 2, busy (950 + 900) / 2
    assert r0["comm_ms"] == ms(0.25) and r0["exposed_ms"] == ms(0.075) and r0["overlap"] == ms(1 - 0.075 / 0.25)
    assert r0["data_wait_ms"] == ms(0.05) and r0["iteration_ms"] == ms(1.0) and r0["busy_ms"] == ms(0.925)
    assert r0["update_ms"] == ms(0.05)
    # forward per rank: (200 + 100) and 400, the trial inside conv1 not counted again
    assert r0["forward_ms"] == ms(0.35) and r0["backward_ms"] == ms(0.2)
    # rank 1: comm (300 + 500) / 2, exposed (20 + 400) / 2, data wait 300 / 2
    assert r1["comm_ms"] == ms(0.4) and r1["exposed_ms"] == ms(0.21) and r1["overlap"] == ms(1 - 0.21 / 0.4)
    assert r1["data_wait_ms"] == ms(0.15) and r1["busy_ms"] == ms((980 + 600) / 2 / 1e3)


def test_slowest_rank_per_iteration():
    per_iteration = summarize(two_ranks())["per_iteration"]
    assert [(it["iter"], it["slowest"]) for it in per_iteration] == [(0, 1), (1, 0)]
    assert per_iteration[0]["busy_ms"] == {0: pytest.approx(0.95), 1: pytest.approx(0.98)}
    assert per_iteration[1]["busy_ms"] == {0: pytest.approx(0.9), 1: pytest.approx(0.6)}
    assert per_iteration[1]["iteration_ms"] == {0: pytest.approx(1.0), 1: pytest.approx(1.0)}


def test_layer_table():
    result = summarize(two_ranks())
    # 4 (rank, iteration) pairs; conv1 forward: 200 + 200 + 400 + 300, backward 300 + 200
    assert [(r["name"], r["type"]) for r in result["layers"]] == [("conv1", "Convolution"), ("ip1", "InnerProduct")]
    conv1, ip1 = result["layers"]
    assert conv1["forward_ms"] == pytest.approx(1.1 / 4) and conv1["backward_ms"] == pytest.approx(0.5 / 4)
    assert ip1["forward_ms"] == pytest.approx(0.2 / 4) and ip1["backward_ms"] == pytest.approx(0.2 / 4)
    assert result["trials"] == {"count": 1, "ms": pytest.approx(0.08)}


def test_no_comm_means_no_overlap_figure():
    doc = {"traceEvents": metadata([0]) + [X(0, COMPUTE, "forward", "a", 0, 10, 0)]}
    (rank,) = summarize(doc)["ranks"]
    assert rank["overlap"] is None and rank["comm_ms"] == 0 and rank["iteration_ms"] == pytest.approx(0.01)


def test_iteration_from_the_containing_span_and_extent_without_one():
    # events of another tool: no args.iter; iteration spans of the process say which iteration they are in
    events = [X(0, COMPUTE, "iteration", "iteration", 0, 100, 4), X(0, COMPUTE, "iteration", "iteration", 100, 250, 5),
              X(0, COMPUTE, "forward", "a", 10, 40), X(0, COMPUTE, "forward", "a", 110, 200),
              X(1, 7, "forward", "a", 1000, 1030, 4), X(1, 7, "backward", "a", 1040, 1100, 4)]
    result = summarize({"traceEvents": metadata([0]) + events})
    assert result["iterations"] == [4, 5]
    assert result["layers"][0]["forward_ms"] == pytest.approx((0.03 + 0.09 + 0.03) / 3)
    r1 = result["ranks"][1]
    # pid 1 has no thread named compute: its forward/backward row is; no iteration span: first start to last end
    assert r1["name"] == "pid 1" and r1["iteration_ms"] == pytest.approx(0.1)
    assert r1["forward_ms"] == pytest.approx(0.03)


def test_a_trace_without_iterations_is_one():
    events = [X(0, COMPUTE, "forward", "a", 0, 10), X(0, COMPUTE, "backward", "a", 10, 30)]
    result = summarize({"traceEvents": metadata([0]) + events})
    assert result["iterations"] == [0] and result["ranks"][0]["iteration_ms"] == pytest.approx(0.03)
