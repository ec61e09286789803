"""Chrome Trace Event files: written from the recorder's parts (atomically), read back and checked, merged.

A file is the JSON object form of the Trace Event Format, which chrome://tracing and Perfetto open::

    {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}

Spans are complete events, ``{"ph": "X", "cat", "name", "ts", "dur", "pid", "tid", "args"}``, with ``ts`` and
``dur`` in microseconds of the host's monotonic clock (rank 0's clock after alignment); ``args.iter`` is the
solver iteration the span started in. Metadata events (``"ph": "M"``) name each pid (``process_name``:
``"rank R"``) and each tid (``thread_name``: ``compute``, ``comm``, ``data``, ``host``, ``device`` ...).
``otherData`` holds the recorded window and, per pid, the clock offsets measured (see layerforge.trace.clocks),
whether they were subtracted, and their error bound.
"""
import json
import os

import numpy

from ..errors import LayerforgeError
from ..npz import write_atomic
from .clocks import offset_at

# rows in this order within a process (chrome://tracing and Perfetto sort threads by thread_sort_index)
ROW_ORDER = ("compute", "data", "comm", "host", "device")


class TraceFileError(LayerforgeError):
    """A file that is not a readable Chrome trace; the message starts with its path."""


def chrome_events(parts):
    """The Chrome Trace Event list of recorder parts (see ``Recorder.part``), metadata events first.

    A part whose ``metadata.clock`` is marked ``applied`` has its measured offsets subtracted (rank 0's clock);
    otherwise its times stay as measured and the offsets go into the file for ``trace merge`` to apply.
    """
    out = []
    for part in parts:
        pid = part["pid"]
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": part["process_name"]}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        tids = {}
        for key, (tid, row) in part["threads"].items():
            tids[key] = tid
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": row}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                        "args": {"sort_index": row_rank(row)}})
        clock = part["metadata"].get("clock")
        starts = [event[2] for event in part["events"]]
        shifts = (numpy.interp(starts, *zip(*sorted(clock["points"]))) if clock and clock["applied"] and starts
                  else numpy.zeros(len(starts)))
        for (cat, name, start, dur, key, iteration, args), shift in zip(part["events"], shifts.tolist()):
            event_args = {"iter": iteration} if iteration is not None else {}
            if args:
                event_args.update(args)
            out.append({"ph": "X", "cat": cat, "name": str(name), "ts": round((start - shift) * 1e6, 3),
                        "dur": round(dur * 1e6, 3), "pid": pid, "tid": tids[key], "args": event_args})
    return out


def row_rank(row):
    """Where a row named ``row`` (``"comm"``, ``"host 1"`` ...) goes among a process's rows."""
    role = row.split(" ")[0]
    return ROW_ORDER.index(role) if role in ROW_ORDER else len(ROW_ORDER)


def trace_document(parts):
    """The whole file's object for recorder parts."""
    processes = {}
    window = None
    for part in parts:
        meta = part["metadata"]
        window = window or meta.get("trace_iterations")
        clock = meta.get("clock")
        if clock:
            processes[str(part["pid"])] = {
                "clock_points_us": [[round(t * 1e6, 3), round(offset * 1e6, 3)] for t, offset in clock["points"]],
                "clock_error_us": round(clock["error_s"] * 1e6, 3), "clock_applied": clock["applied"]}
    return {"traceEvents": chrome_events(parts), "displayTimeUnit": "ms",
            "otherData": {"producer": "layerforge", "trace_iterations": window, "clock": "CLOCK_MONOTONIC, us",
                          "processes": processes}}


def write_trace(path, parts_or_document):
    """Write a trace file atomically (a temporary file renamed over ``path``): a run killed while writing
    leaves the previous file or none, never half of one. Takes recorder parts or a finished document."""
    doc = parts_or_document if isinstance(parts_or_document, dict) else trace_document(parts_or_document)
    text = json.dumps(doc, separators=(",", ":"), default=_jsonable).encode()
    write_atomic(path, lambda f: f.write(text))
    return path


def _jsonable(value):
    item = getattr(value, "item", None)  # a numpy scalar
    if item is not None and getattr(value, "ndim", 1) == 0:
        return item()
    tolist = getattr(value, "tolist", None)
    if tolist is not None:
        return tolist()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    return str(value)


_REQUIRED = (("name", str), ("cat", str), ("ts", (int, float)), ("dur", (int, float)), ("pid", int), ("tid", int))


def load_trace(path, need_spans=True):
    """Read and check a trace file; returns its document (a bare event array is accepted and wrapped).

    Raises:
        TraceFileError: ``PATH: ...`` for a file that cannot be read, is empty, is not JSON, is not a trace,
            has a malformed complete event, or (with ``need_spans``) has no complete events at all.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceFileError(f"{path}: cannot read: {e.strerror}") from None
    if not raw.strip():
        raise TraceFileError(f"{path}: the file is empty, not a trace")
    try:
        doc = json.loads(raw)
    except UnicodeDecodeError:
        raise TraceFileError(f"{path}: not a JSON text file (binary content)") from None
    except json.JSONDecodeError as e:
        raise TraceFileError(f"{path}: not JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceFileError(f"{path}: not a Chrome trace: expected an object with a 'traceEvents' list "
                             f"or an array of events")
    spans = 0
    for k, event in enumerate(doc["traceEvents"]):
        if not isinstance(event, dict) or not isinstance(event.get("ph"), str):
            raise TraceFileError(f"{path}: traceEvents[{k}]: not an event (an object with a 'ph' string)")
        if event["ph"] != "X":
            continue
        spans += 1
        for key, kind in _REQUIRED:
            value = event.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise TraceFileError(f"{path}: traceEvents[{k}] ('{event.get('name', '?')}'): complete event "
                                     f"without a valid '{key}'")
        if event["dur"] < 0:
            raise TraceFileError(f"{path}: traceEvents[{k}] ('{event['name']}'): negative 'dur'")
        if "args" in event and not isinstance(event["args"], dict):
            raise TraceFileError(f"{path}: traceEvents[{k}] ('{event['name']}'): 'args' is not an object")
    if need_spans and not spans:
        raise TraceFileError(f"{path}: no complete ('ph': 'X') events: nothing was recorded in this trace")
    return doc


def merge_traces(named_docs):
    """One document from ``[(path, document), ...]`` written per rank (or per run of one host).

    A pid may appear in one input only. A process whose ``otherData.processes[pid].clock_applied`` is false
    has its measured offsets (``clock_points_us``: ``[local time, offset]`` pairs, interpolated) subtracted
    now; inputs without offsets are taken as one clock (the processes of one host share CLOCK_MONOTONIC).
    """
    events, processes, owner, window = [], {}, {}, None
    for path, doc in named_docs:
        other = doc.get("otherData") if isinstance(doc.get("otherData"), dict) else {}
        window = window or other.get("trace_iterations")
        clocks = other.get("processes") if isinstance(other.get("processes"), dict) else {}
        pids = {e.get("pid") for e in doc["traceEvents"] if "pid" in e}
        for pid in pids:
            if pid in owner:
                raise TraceFileError(f"{path}: pid {pid} is also in {owner[pid]}: each rank's events may come from "
                                     f"one file only")
            owner[pid] = path
        shift = {}
        for pid in pids:
            clock = dict(clocks.get(str(pid), {}))
            if clock and not clock.get("clock_applied", True):
                try:
                    shift[pid] = [(float(t), float(offset)) for t, offset in clock["clock_points_us"]]
                except (KeyError, TypeError, ValueError):
                    raise TraceFileError(f"{path}: otherData.processes['{pid}']: clock_points_us is not a list of "
                                         f"[time, offset] pairs") from None
                clock["clock_applied"] = True
            if clock:
                processes[str(pid)] = clock
        for event in doc["traceEvents"]:
            points = shift.get(event.get("pid"))
            if points and isinstance(event.get("ts"), (int, float)):
                event = {**event, "ts": round(event["ts"] - offset_at(points, event["ts"]), 3)}
            events.append(event)
    metadata = [e for e in events if e.get("ph") == "M"]
    rest = [e for e in events if e.get("ph") != "M"]
    return {"traceEvents": metadata + rest, "displayTimeUnit": "ms",
            "otherData": {"producer": "layerforge", "trace_iterations": window, "clock": "CLOCK_MONOTONIC, us",
                          "processes": processes}}


def merge_files(out, paths):
    """``layerforge trace merge``: read ``paths``, merge them (:func:`merge_traces`), write ``out`` atomically."""
    if os.path.abspath(out) in {os.path.abspath(p) for p in paths}:
        raise TraceFileError(f"{out}: the output is also an input; write the merged trace to a new file")
    return write_trace(out, merge_traces([(p, load_trace(p, need_spans=False)) for p in paths]))
