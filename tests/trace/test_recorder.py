"""The recorder: nothing recorded outside the window (and the null span then), the written file's structure,
thread rows, layer spans, waits, NVTX and device-span hooks."""
import json
import threading
import time
import types

import pytest

import layerforge
from layerforge import trace
from layerforge.trace import clocks, recorder
from layerforge.trace.events import load_trace


def x_events(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def test_off_returns_the_shared_null_span():
    assert trace.current_recorder() is None and not trace.active()
    assert trace.span("forward", "conv1", type="Convolution") is trace.NULL_SPAN
    assert trace.layer("forward", object(), [], []) is trace.NULL_SPAN
    assert trace.begin("comm", "bucket 0") is None
    trace.end(None)
    trace.complete("comm", "bucket 0", 0.0, 1.0)
    trace.iteration(3)
    with trace.span("update", "sgd") as s:
        assert s is trace.NULL_SPAN
    assert trace.stop() is None and trace.finish() is None


def test_outside_the_window_is_the_null_span_and_records_nothing(tmp_path):
    rec = trace.start(str(tmp_path / "t.json"), iterations=(2, 4))
    assert trace.span("forward", "x") is trace.NULL_SPAN  # before the first iteration, A > 0
    trace.iteration(1)
    assert trace.span("forward", "x") is trace.NULL_SPAN
    trace.complete("comm", "x", trace.clock(), 0.001)
    assert rec.events == []
    trace.iteration(2)
    assert trace.span("forward", "x") is not trace.NULL_SPAN


@pytest.mark.parametrize("window, recorded", [((2, 4), [2, 3]), ((0, 1), [0]), ((3, None), [3, 4, 5]),
                                              (None, [0, 1, 2, 3, 4, 5])])
def test_window_respected(tmp_path, window, recorded):
    path = tmp_path / "t.json"
    trace.start(str(path), iterations=window)
    for k in range(6):
        trace.iteration(k)
        with trace.span("forward", "conv1"):
            pass
        trace.complete("comm", "bucket 0", trace.clock(), 1e-4, {"bytes": 8}, thread="comm")
        with trace.wait("data"):
            pass
    trace.finish()
    events = x_events(load_trace(str(path)))
    for cat in ("forward", "comm", "data", "iteration"):
        assert sorted(e["args"]["iter"] for e in events if e["cat"] == cat) == recorded, cat


def test_file_structure_threads_and_metadata(tmp_path):
    path = tmp_path / "t.json"
    trace.start(str(path), iterations=(1, 3), pid=3, process_name="worker 3")

    def comm_thread():
        with trace.span("comm", "bucket 0", bytes=4096, layers=["conv1", "ip1"]):
            time.sleep(0.001)

    def data_thread():
        with trace.span("data", "decode", records=8):
            pass

    for k in range(4):
        trace.iteration(k)
        with trace.span("forward", "conv1", type="Convolution", top=[(2, 3, 4, 4)]):
            pass
        token = trace.begin("backward", "conv1")
        threads = [threading.Thread(target=comm_thread, name="layerforge-comm_0"),
                   threading.Thread(target=data_thread, name="prefetch:data")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        trace.end(token, engine="IM2COL")
        with trace.wait("comm"):
            pass
    trace.finish()
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms" and doc["otherData"]["trace_iterations"] == [1, 3]
    spans = x_events(doc)
    assert spans
    for e in spans:
        assert set(e) == {"ph", "cat", "name", "ts", "dur", "pid", "tid", "args"}
        assert e["cat"] in trace.CATEGORIES and isinstance(e["name"], str)
        assert isinstance(e["ts"], float) and e["dur"] >= 0 and e["pid"] == 3 and isinstance(e["tid"], int)
        assert e["args"]["iter"] in (1, 2)
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    assert {"name": "process_name", "args": {"name": "worker 3"}}.items() <= meta[0].items()
    rows = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert sorted(rows.values()) == ["comm", "comm 1", "compute", "data", "data 1"]  # two threads of each role
    by_cat = {e["cat"]: e for e in spans}
    assert rows[by_cat["forward"]["tid"]] == "compute" and rows[by_cat["data"]["tid"]].startswith("data")
    assert by_cat["backward"]["args"] == {"iter": 2, "engine": "IM2COL"}
    assert by_cat["forward"]["args"]["top"] == [[2, 3, 4, 4]]
    comm = [e for e in spans if e["cat"] == "comm" and e["name"] == "bucket 0"]
    assert [rows[e["tid"]] for e in comm] == ["comm", "comm 1"] and comm[0]["args"]["layers"] == ["conv1", "ip1"]
    # the comm thread's span lies inside the compute thread's backward span of the same iteration
    backward = [e for e in spans if e["cat"] == "backward"]
    for b, c in zip(backward, comm):
        assert b["ts"] <= c["ts"] and c["ts"] + c["dur"] <= b["ts"] + b["dur"]


def test_iteration_spans_cover_each_iteration(tmp_path):
    path = tmp_path / "t.json"
    trace.start(str(path), iterations=(0, 3))
    starts = []
    for k in range(3):
        starts.append(trace.clock())
        trace.iteration(k)
        time.sleep(0.002)
    end = trace.clock()
    trace.finish()
    frames = [e for e in x_events(load_trace(str(path))) if e["cat"] == "iteration"]
    assert [e["args"]["iter"] for e in frames] == [0, 1, 2]
    for e, lo, hi in zip(frames, starts, starts[1:] + [end]):
        assert lo * 1e6 <= e["ts"] <= hi * 1e6 and e["dur"] >= 2000


def test_unknown_category_is_refused():
    trace.start(None, iterations=None)
    with pytest.raises(ValueError, match="trace category 'fwd'"):
        trace.span("fwd", "conv1")
    with pytest.raises(ValueError, match="wait kind 'update'"):
        trace.wait("update")


def test_waits_are_measured_with_tracing_off():
    before = trace.waited()
    with trace.wait("data"):
        time.sleep(0.003)
    with trace.wait("comm", "bucket 0", bytes=16):
        time.sleep(0.001)
    after = trace.waited()
    assert 0.003 <= after["data"] - before["data"] < 0.5
    assert 0.001 <= after["comm"] - before["comm"] < 0.5


def test_layer_spans_carry_type_shapes_bytes_and_flops():
    net = layerforge.Net({"name": "t", "layers": [
        {"name": "input", "type": "Input", "top": "data", "input": {"shape": [[4, 3]]}},
        {"name": "ip1", "type": "InnerProduct", "bottom": "data", "top": "ip1", "inner_product": {"num_output": 5}},
    ]}, dtype="float32")
    rec = trace.start(None, iterations=None)
    i = 1
    bottom, top = net.bottom_blobs(i), net.top_blobs(i)
    net.forward_layer(i)  # the net records its layers' spans itself
    with trace.layer("backward", net.layers[i], bottom, top, trial="IM2COL"):
        pass
    (cat, name, _, _, _, _, args), (_, _, _, _, _, _, back) = rec.events
    assert (cat, name) == ("forward", "ip1")
    # 4 x 3 inputs to 5 outputs: 60 multiply-adds; the top is 4 x 5 float32
    assert args == {"type": "InnerProduct", "top": [[4, 5]], "bytes": 80, "flops": 120}
    assert back["flops"] == 240 and back["trial"] == "IM2COL"


def test_window_close_writes_the_file_off_the_training_thread(tmp_path):
    path = tmp_path / "t.json"
    rec = trace.start(str(path), iterations=(0, 2))
    for k in range(3):
        trace.iteration(k)
        with trace.span("update", "sgd"):
            pass
    assert rec.writer is not None and rec.writer.name == "layerforge-trace-writer"
    rec.writer.join()
    assert len(x_events(load_trace(str(path)))) == 4  # two updates and two iteration spans
    mtime = path.stat().st_mtime_ns
    assert trace.finish() == str(path)
    assert path.stat().st_mtime_ns == mtime  # nothing new: not written again


class FakeNvtx:
    def __init__(self):
        self.calls = []

    def RangePush(self, name):
        self.calls.append(("push", name))

    def RangePop(self):
        self.calls.append(("pop",))


class FakeEvent:
    """A CUDA event of a fake device whose clock is a counter advanced by the test."""
    now = [0.0]

    def record(self):
        self.t = FakeEvent.now[0]

    def synchronize(self):
        pass


def fake_cupy(nvtx):
    cuda = types.SimpleNamespace(nvtx=nvtx, Event=FakeEvent,
                                 get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3)  # milliseconds
    return types.SimpleNamespace(__name__="cupy", cuda=cuda)


def test_nvtx_ranges_follow_spans_on_cupy():
    nvtx = FakeNvtx()
    trace.start(None, iterations=None, xp=fake_cupy(nvtx))
    with trace.span("forward", "conv1"):
        with trace.span("forward", "conv1", trial="IMPLICIT"):
            pass
    with trace.wait("comm"):  # a wait is no NVTX range
        pass
    assert nvtx.calls == [("push", "conv1"), ("push", "conv1"), ("pop",), ("pop",)]


def test_no_nvtx_on_numpy_or_without_nvtx():
    import numpy

    assert trace.start(None, iterations=None, xp=numpy).nvtx is None
    assert trace.start(None, iterations=None, xp=fake_cupy(types.SimpleNamespace(available=False))).nvtx is None


def test_device_spans_are_placed_by_the_reference_event(monkeypatch):
    host = [100.0]
    monkeypatch.setattr(recorder, "clock", lambda: host[0])
    monkeypatch.setattr(clocks, "clock", lambda: host[0])  # the device spans' reference reading
    FakeEvent.now[0] = 7.0  # the device's own time base: irrelevant, only differences count
    trace.start(None, iterations=None, xp=fake_cupy(FakeNvtx()), device_spans=True)  # reference at host 100.0
    FakeEvent.now[0] = 7.5  # the device starts the work 0.5 s after the reference event
    with trace.span("forward", "conv1", type="Convolution"):
        FakeEvent.now[0] = 7.75
    part = trace.stop()
    device = [e for e in part["events"] if part["threads"][e[4]][1] == "device"]
    assert len(device) == 1
    cat, name, start, dur, _, _, args = device[0]
    assert (cat, name, args) == ("forward", "conv1", {"type": "Convolution"})
    assert start == pytest.approx(100.5) and dur == pytest.approx(0.25)


@pytest.mark.parametrize("text, window", [("5:10", (5, 10)), ("0:1", (0, 1)), (" 3: ", (3, None)), ("all", None)])
def test_parse_window(text, window):
    assert trace.parse_window(text) == window


@pytest.mark.parametrize("text, reason", [("5-10", "expected A:B"), ("a:b", "expected A:B"), ("5", "expected A:B"),
                                          ("5:5", "0 <= A < B"), ("-1:3", "0 <= A < B")])
def test_parse_window_refuses(text, reason):
    with pytest.raises(ValueError, match=reason):
        trace.parse_window(text)


def test_a_span_belongs_to_the_iteration_it_starts_in(tmp_path):
    path = tmp_path / "t.json"
    trace.start(str(path), iterations=(0, 3))
    trace.iteration(0)
    token = trace.begin("comm", "bucket 0")  # posted in iteration 0, done in iteration 1
    with trace.wait("data"):
        trace.iteration(1)
    trace.end(token)
    trace.finish()
    spans = {e["cat"]: e for e in x_events(load_trace(str(path))) if e["cat"] != "iteration"}
    assert spans["comm"]["args"]["iter"] == 0 and spans["data"]["args"]["iter"] == 0


def test_naming_a_thread_again_keeps_its_row():
    rec = trace.start(None, iterations=None)
    trace.name_thread("compute")
    trace.name_thread("compute")
    assert list(rec.threads.values()) == [(threading.get_native_id(), "compute")]
    trace.name_thread("host")
    assert list(rec.threads.values()) == [(threading.get_native_id(), "host")]


def test_an_empty_window_is_written_and_said(tmp_path, caplog):
    path = tmp_path / "t.json"
    trace.start(str(path), iterations=(5, 10))
    for k in range(3):  # a run shorter than the window
        trace.iteration(k)
        with trace.span("forward", "a"):
            pass
    with caplog.at_level("WARNING", logger="layerforge"):
        assert trace.finish() == str(path)
    assert "no iteration of the window 5:10 ran on rank 0" in caplog.text
    assert json.loads(path.read_text())["traceEvents"][0]["args"] == {"name": "rank 0"}


def test_parts_of_other_processes_are_written_with_this_one(tmp_path):
    # a CGDP host: its workers (processes of this host, one clock) hand their parts over at the end
    trace.start(None, iterations=None, pid=1, process_name="worker 1")
    with trace.span("backward", "conv1"):
        pass
    worker = trace.stop()
    path = tmp_path / "t.json"
    trace.start(str(path), iterations=None, pid=100, process_name="host")
    with trace.span("host", "accumulate chunk 0"):
        pass
    trace.absorb(worker)
    trace.finish()
    spans = x_events(load_trace(str(path)))
    assert sorted((e["pid"], e["cat"]) for e in spans) == [(1, "backward"), (100, "host")]


def test_a_span_begun_as_tracing_stops_is_harmless():
    trace.start(None, iterations=None)
    recorder._active = True  # as another thread sees it between stop()'s two assignments
    saved, recorder._recorder = recorder._recorder, None
    try:
        assert trace.span("comm", "bucket 0") is trace.NULL_SPAN and trace.begin("comm", "x") is None
        trace.complete("comm", "bucket 0", 0.0, 1.0)
        with trace.wait("comm"):
            pass
    finally:
        recorder._recorder = saved
