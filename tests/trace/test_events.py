"""Trace files: written atomically (a killed writer leaves a valid file or none), checked when read, merged."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from layerforge.trace.events import TraceFileError, load_trace, merge_traces, trace_document, write_trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def part(pid, events, clock=None, name=None):
    """A recorder part with spans ``(cat, name, start s, dur s, iteration)`` on one compute thread."""
    meta = {"trace_iterations": [0, 2]}
    if clock:
        meta["clock"] = clock
    return {"pid": pid, "process_name": name or f"rank {pid}", "threads": {0: (100 + pid, "compute")},
            "events": [(c, n, s, d, 0, k, None) for c, n, s, d, k in events], "metadata": meta}


def test_document_of_parts_applies_measured_offsets():
    # rank 1's clock reads 2 s ahead at local time 10 s and 2.5 s ahead at 20 s: 2.25 s at 15 s
    clock = {"points": [(10.0, 2.0), (20.0, 2.5)], "error_s": 1e-5, "applied": True}
    doc = trace_document([part(0, [("forward", "a", 12.75, 0.5, 0)]),
                          part(1, [("forward", "a", 15.0, 0.5, 0)], clock)])
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [(e["pid"], e["ts"], e["dur"]) for e in spans] == [(0, 12.75e6, 5e5), (1, 12.75e6, 5e5)]
    assert doc["otherData"]["processes"]["1"] == {"clock_points_us": [[10e6, 2e6], [20e6, 2.5e6]],
                                                  "clock_error_us": 10.0, "clock_applied": True}


def test_merge_applies_offsets_not_yet_applied(tmp_path):
    clock = {"points": [(10.0, 2.0), (20.0, 2.5)], "error_s": 1e-5, "applied": False}
    write_trace(tmp_path / "r0.json", [part(0, [("forward", "a", 12.75, 0.5, 0)])])
    write_trace(tmp_path / "r1.json", [part(1, [("forward", "a", 15.0, 0.5, 0)], clock)])
    unmerged = load_trace(tmp_path / "r1.json")
    assert [e["ts"] for e in unmerged["traceEvents"] if e["ph"] == "X"] == [15e6]  # as measured
    merged = merge_traces([(p, load_trace(tmp_path / p)) for p in ("r0.json", "r1.json")])
    spans = [e for e in merged["traceEvents"] if e["ph"] == "X"]
    assert [(e["pid"], e["ts"]) for e in spans] == [(0, 12.75e6), (1, 12.75e6)]
    assert merged["otherData"]["processes"]["1"]["clock_applied"] is True
    # metadata events first, names of both ranks kept
    names = [e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"]
    assert names == ["rank 0", "rank 1"] and merged["traceEvents"][0]["ph"] == "M"
    # merging the merged file again shifts nothing twice
    again = merge_traces([("m", merged)])
    assert [e["ts"] for e in again["traceEvents"] if e["ph"] == "X"] == [12.75e6, 12.75e6]


def test_merge_refuses_a_pid_in_two_files(tmp_path):
    write_trace(tmp_path / "a.json", [part(0, [("forward", "a", 1.0, 0.1, 0)])])
    write_trace(tmp_path / "b.json", [part(0, [("forward", "a", 1.0, 0.1, 0)])])
    with pytest.raises(TraceFileError, match=r"b.json: pid 0 is also in a.json"):
        merge_traces([("a.json", load_trace(tmp_path / "a.json")), ("b.json", load_trace(tmp_path / "b.json"))])


BAD_FILES = [
    (b"", "the file is empty"),
    (b"  \n", "the file is empty"),
    (b"{\"traceEvents\": [", "not JSON: line 1 column 18: Expecting value"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", "not a JSON text file"),
    (b"[1, 2]", r"traceEvents\[0\]: not an event"),
    (b"{\"events\": []}", "not a Chrome trace"),
    (b"42", "not a Chrome trace"),
    (b"{\"traceEvents\": []}", "no complete"),
    (b"{\"traceEvents\": [{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": 0, \"args\": {}}]}", "no complete"),
    (b"{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"a\", \"cat\": \"forward\", \"ts\": 1, \"pid\": 0, \"tid\": 0}]}",
     r"traceEvents\[0\] \('a'\): complete event without a valid 'dur'"),
    (b"{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"a\", \"cat\": \"forward\", \"ts\": \"1\", \"dur\": 1, \"pid\": 0,"
     b" \"tid\": 0}]}", "without a valid 'ts'"),
    (b"{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"a\", \"cat\": \"forward\", \"ts\": 1, \"dur\": -1, \"pid\": 0,"
     b" \"tid\": 0}]}", "negative 'dur'"),
]


@pytest.mark.parametrize("content, message", BAD_FILES)
def test_bad_files_are_named_with_the_reason(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceFileError, match=message) as info:
        load_trace(str(path))
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_missing_file():
    with pytest.raises(TraceFileError, match="nope.json: cannot read: No such file"):
        load_trace("nope.json")


WRITER = """
import os, sys, time
from layerforge.trace import events
path, mode = sys.argv[1], sys.argv[2]
parts = [{"pid": 0, "process_name": "rank 0", "threads": {0: (1, "compute")}, "metadata": {},
          "events": [("forward", f"layer {i}", i * 1e-3, 1e-3, 0, i // 100, {"bytes": i}) for i in range(20000)]}]
if mode == "hang-before-rename":  # stop with the whole new file written and synced, not yet renamed
    real = os.fsync
    def fsync(fd):
        real(fd)
        open(path + ".synced", "w").close()
        time.sleep(60)
    os.fsync = fsync
    events.write_trace(path, parts)
else:  # write again and again until killed
    open(path + ".started", "w").close()
    while True:
        events.write_trace(path, parts)
"""


def run_writer(tmp_path, mode):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "t.json"), mode], env=env, cwd=ROOT)


def wait_for(path, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, "the writer ended early"
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.02)


@pytest.mark.parametrize("earlier", [False, True])
def test_killed_before_the_rename_leaves_the_old_file_or_none(tmp_path, earlier):
    target = tmp_path / "t.json"
    if earlier:
        write_trace(target, [part(0, [("forward", "old", 1.0, 0.1, 0)])])
    proc = run_writer(tmp_path, "hang-before-rename")
    try:
        wait_for(str(target) + ".synced", proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    temporaries = [p for p in os.listdir(tmp_path) if p.startswith("t.json.") and p.endswith(".tmp")]
    assert len(temporaries) == 1 and os.path.getsize(tmp_path / temporaries[0]) > 1e6  # the new, unrenamed file
    if earlier:
        spans = [e for e in load_trace(str(target))["traceEvents"] if e["ph"] == "X"]
        assert [e["name"] for e in spans] == ["old"]
    else:
        assert not target.exists()


def test_killed_at_any_moment_leaves_a_valid_file_or_none(tmp_path):
    target = tmp_path / "t.json"
    seen = set()
    for delay in (0.01, 0.1, 0.25, 0.6):  # one write takes about 0.15 s
        proc = run_writer(tmp_path, "loop")
        try:
            wait_for(str(target) + ".started", proc)
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait()
        seen.add(target.exists())
        if target.exists():
            doc = json.loads(target.read_text())
            assert len(doc["traceEvents"]) == 20004  # 2 process + 2 thread metadata events, every span
        os.unlink(str(target) + ".started")
    assert True in seen  # at least one kill came after a complete write (then during a later one)
