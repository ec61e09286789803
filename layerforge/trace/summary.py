"""What a trace says about a run: per-layer times, and per rank the communication it waited for and its input waits.

Definitions (all in milliseconds per iteration, averaged over the iterations the trace holds):

- **iteration**: an event belongs to the iteration in its ``args.iter`` (the recorder tags every span with the
  solver iteration it started in; a span from another tool without one belongs to the "iteration" span of its
  process that contains its start). A rank's iteration time is the duration of its ``iteration`` span (or,
  without one, from the first start to the last end of its compute thread's spans of that iteration).
- **compute thread**: the row named ``compute`` (the thread that runs forward, backward and update).
- **comm**: the time some collective of the rank was in progress, or its compute thread waited for one: the
  union of its ``comm`` spans on every row (a wait lasts until the compute thread learns the collective is done,
  which on a loaded machine is later than its end).
- **exposed comm**: the time the compute thread spent in ``comm`` spans: waiting for buckets in flight (spans
  named ``wait``) or running an allreduce itself; a part of comm, so never more. Overlap ratio = 1 - exposed /
  comm (1: fully hidden behind backward, 0: nothing hidden). GradientExchange's display line counts both alike.
- **data wait**: the union of ``data`` spans on the compute thread (the training loop waiting for a batch).
- **host**: the time some ``host`` span of the process was in progress, on any row (a CGDP host's accumulations,
  a GPU worker's copies to and from host memory).
- **busy**: iteration time less exposed comm: what the rank did itself. In synchronous data parallelism every
  rank's iteration lasts as long as the slowest one's, because the exchange makes the others wait; the
  **slowest rank** of an iteration is therefore the one with the largest busy time (the others wait for it).
  Only processes that compute (with a compute thread) compete: a CGDP host, which only combines the workers'
  gradients, is listed but never the slowest.
- **layer table**: per layer name, the sum of its ``forward`` and ``backward`` spans over all ranks and
  iterations divided by (ranks x iterations). AUTO's engine trials (spans with ``args.trial``) run inside the
  layer's own span and are counted there, not again.
"""
import collections


def union_length(intervals):
    """Total length covered by ``[(start, end), ...]`` (overlaps counted once)."""
    total, reach = 0.0, None
    for lo, hi in sorted(intervals):
        if reach is None or lo > reach:
            total += hi - lo
            reach = hi
        elif hi > reach:
            total += hi - reach
            reach = hi
    return total


def spans(doc):
    """The complete events of a (checked) trace document."""
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def names(doc):
    """``(process names {pid: name}, thread names {(pid, tid): name})`` from the metadata events."""
    processes, threads = {}, {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and isinstance(e.get("args"), dict):
            if e.get("name") == "process_name":
                processes[e["pid"]] = str(e["args"].get("name"))
            elif e.get("name") == "thread_name":
                threads[(e["pid"], e.get("tid"))] = str(e["args"].get("name"))
    return processes, threads


def compute_threads(doc, events=None):
    """``{pid: tid}`` of each process's compute thread: the row named ``compute``, else (a trace from elsewhere)
    the row with the most forward and backward time."""
    events = spans(doc) if events is None else events
    _, threads = names(doc)
    out = {pid: tid for (pid, tid), name in threads.items() if name == "compute"}
    work = collections.Counter()
    for e in events:
        if e["pid"] not in out and e["cat"] in ("forward", "backward"):
            work[(e["pid"], e["tid"])] += e["dur"]
    for (pid, tid), _ in work.most_common():
        out.setdefault(pid, tid)
    return out


def iteration_of(events):
    """``{id(event): iteration}``: ``args.iter``, else the containing ``iteration`` span's, else None; a trace
    without any iteration information is one iteration, 0."""
    frames = collections.defaultdict(list)
    for e in events:
        if e["cat"] == "iteration" and _iter(e) is not None:
            frames[e["pid"]].append((e["ts"], e["ts"] + e["dur"], _iter(e)))
    out = {}
    for e in events:
        k = _iter(e)
        if k is None:
            k = next((i for lo, hi, i in frames.get(e["pid"], ()) if lo <= e["ts"] < hi), None)
        out[id(e)] = k
    if all(k is None for k in out.values()):
        out = {key: 0 for key in out}
    return out


def _iter(e):
    args = e.get("args")
    k = args.get("iter") if isinstance(args, dict) else None
    return k if isinstance(k, int) and not isinstance(k, bool) else None


def summarize(doc):
    """The figures of the module docstring for a checked trace document (see ``events.load_trace``).

    Returns a dict: ``iterations`` (sorted), ``ranks`` ([{pid, name, iterations, iteration_ms, busy_ms,
    forward_ms, backward_ms, update_ms, comm_ms, exposed_ms, overlap, data_wait_ms}]), ``layers`` ([{name,
    type, forward_ms, backward_ms}] in forward order), ``per_iteration`` ([{iter, slowest, busy_ms {pid: ms},
    iteration_ms {pid: ms}}]) and ``trials`` ({count, ms}). ``ranks`` also has ``host_ms``; ``busy_ms`` of
    ``per_iteration`` holds the processes that compute only (see the module docstring).
    """
    events = spans(doc)
    processes, _ = names(doc)
    compute = compute_threads(doc, events)
    iteration = iteration_of(events)
    cells = collections.defaultdict(lambda: collections.defaultdict(list))  # (pid, k) -> what -> intervals
    frame = {}  # (pid, k) -> iteration span seconds
    layer_ms = collections.defaultdict(float)  # (name, cat) -> us
    layer_first, layer_type = {}, {}
    trials = [0, 0.0]
    for e in events:
        k = iteration.get(id(e))
        if k is None:
            continue
        pid, cat, span = e["pid"], e["cat"], (e["ts"], e["ts"] + e["dur"])
        cell = cells[(pid, k)]
        on_compute = compute.get(pid) == e["tid"]
        args = e.get("args") or {}
        if cat == "iteration":
            frame[(pid, k)] = e["dur"]
            continue
        if on_compute:
            cell["compute"].append(span)
        if cat in ("forward", "backward"):
            if "trial" in args:
                trials[0] += 1
                trials[1] += e["dur"]
                continue
            layer_ms[(e["name"], cat)] += e["dur"]
            layer_first.setdefault(e["name"], (cat != "forward", e["ts"]))
            layer_type.setdefault(e["name"], args.get("type", ""))
        if cat == "host":
            cell["host"].append(span)
        if cat == "comm":
            cell["comm"].append(span)
            if on_compute:
                cell["exposed"].append(span)
        elif on_compute:
            cell[cat].append(span)

    pairs = sorted(cells)
    per_cell = {}
    for key in pairs:
        cell = cells[key]
        spent = {what: union_length(cell[what]) for what in ("forward", "backward", "update", "comm", "exposed",
                                                             "data", "host")}
        if key in frame:
            spent["iteration"] = frame[key]
        elif cell["compute"]:
            spent["iteration"] = max(hi for _, hi in cell["compute"]) - min(lo for lo, _ in cell["compute"])
        else:
            spent["iteration"] = 0.0
        spent["busy"] = spent["iteration"] - spent["exposed"]
        per_cell[key] = spent

    ranks = []
    for pid in sorted({pid for pid, _ in pairs}):
        mine = [per_cell[key] for key in pairs if key[0] == pid]
        mean = {what: sum(c[what] for c in mine) / len(mine) / 1e3 for what in mine[0]}
        ranks.append({"pid": pid, "name": processes.get(pid, f"pid {pid}"), "iterations": len(mine),
                      "iteration_ms": mean["iteration"], "busy_ms": mean["busy"], "forward_ms": mean["forward"],
                      "backward_ms": mean["backward"], "update_ms": mean["update"], "comm_ms": mean["comm"],
                      "exposed_ms": mean["exposed"],
                      "overlap": max(0.0, 1.0 - mean["exposed"] / mean["comm"]) if mean["comm"] > 0 else None,
                      "data_wait_ms": mean["data"], "host_ms": mean["host"]})

    per_iteration = []
    for k in sorted({k for _, k in pairs}):
        racing = [(pid, kk) for pid, kk in pairs if kk == k and pid in compute] or [p for p in pairs if p[1] == k]
        busy = {pid: per_cell[(pid, kk)]["busy"] / 1e3 for pid, kk in racing}
        whole = {pid: per_cell[(pid, kk)]["iteration"] / 1e3 for pid, kk in pairs if kk == k}
        per_iteration.append({"iter": k, "slowest": max(busy, key=lambda pid: (busy[pid], -pid)), "busy_ms": busy,
                              "iteration_ms": whole})

    count = max(1, len(pairs))
    order = sorted(layer_first, key=lambda name: layer_first[name])
    layers = [{"name": name, "type": layer_type[name], "forward_ms": layer_ms[(name, "forward")] / count / 1e3,
               "backward_ms": layer_ms[(name, "backward")] / count / 1e3} for name in order]
    return {"iterations": sorted({k for _, k in pairs}), "ranks": ranks, "layers": layers,
            "per_iteration": per_iteration, "trials": {"count": trials[0], "ms": trials[1] / 1e3}}
