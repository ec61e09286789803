"""The recorder: spans of training steps, kept in memory while the iteration window is open.

Every call site runs on the hot path of training, so the first thing each public function does is read one
module global, ``_active``; while it is False (tracing off, or outside the window) :func:`span` returns the
shared :data:`NULL_SPAN` and nothing else happens. Spans are buffered as tuples in one list (``list.append``
is atomic in CPython, so threads append without a lock) and turned into Chrome Trace Event dicts only when the
file is written (layerforge.trace.events), after the window closes or when training ends.

Times are ``time.perf_counter()`` seconds: CLOCK_MONOTONIC on Linux, one clock for every process of a host
(the CGDP workers and their host agree without alignment); ranks on other hosts are aligned by
layerforge.trace.clocks.
"""
import logging
import os
import threading

from ..logs import LOGGER_NAME
from . import nvtx
from .clocks import add_clock_point, clock, clock_point, gather_parts
from .events import write_trace

# the steps a span can be; "iteration" is the one span per iteration that trace.iteration() writes itself
CATEGORIES = ("forward", "backward", "update", "data", "comm", "host", "test", "snapshot", "iteration")
WAIT_KINDS = ("data", "comm")
# iterations A <= k < B are recorded unless told otherwise: past iteration 0 (AUTO's engine trials, first-touch
# allocations) and the first test pass, short enough to stay a few MB on a deep net
DEFAULT_WINDOW = (5, 10)
# a thread's row is named after the role its Python name shows (the threads layerforge starts), else that name
THREAD_ROLES = (("MainThread", "compute"), ("layerforge-comm", "comm"), ("prefetch:", "data"),
                ("cgdp-acc", "host"), ("cgdp-copy-out", "host copy-out"), ("cgdp-network", "comm"),
                ("cgdp-inbox", "host copy-back"))
# rows of spans measured elsewhere (complete(..., thread=...)): a device, a non-blocking collective; these tids
# are far above any Linux thread id (at most 2**22)
SYNTHETIC_TID_BASE = 1 << 30


_active = False      # the flag every call reads first: a recorder exists and the window is open
_recorder = None
_waited = {kind: 0.0 for kind in WAIT_KINDS}  # seconds the compute thread waited, since the process started


class _NullSpan:
    """What :func:`span` returns while nothing is recorded: entering and leaving it does nothing."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


NULL_SPAN = _NullSpan()


class Recorder:
    """The spans of one process (one ``pid`` in the trace: an MPI rank or a CGDP worker).

    Args:
        path: the trace file this process (or rank 0 of its job) writes; None to only collect.
        iterations: ``(A, B)``: record while ``A <= iteration < B``; ``(A, None)`` from A on; None: always.
        pid: the trace's process id (the MPI rank, or the CGDP worker's global index).
        process_name: its name in the trace (default ``"rank <pid>"``).
        xp: the array module; with cupy, spans are also NVTX ranges (Nsight Systems shows the same names).
        device_spans: with cupy, also time each :func:`span` on the device by CUDA events (rows "device").
    """

    def __init__(self, path=None, iterations=DEFAULT_WINDOW, pid=0, process_name=None, xp=None,
                 device_spans=False):
        self.path, self.pid = path, int(pid)
        self.process_name = process_name or f"rank {self.pid}"
        self.window = tuple(iterations) if iterations is not None else None
        self.events = []  # (cat, name, start s, duration s, thread key, iteration, args)
        self.threads = {}  # thread key -> (tid, row name)
        self._local = threading.local()  # .key: the calling thread's key
        self._roles = {}  # role -> how many threads of it this process has named
        self._names_lock = threading.Lock()
        self.iter = None  # the solver iteration now running
        self._iter_start = None
        self.nvtx = nvtx.ranges(xp)
        self.device = nvtx.DeviceTimer(xp) if device_spans and nvtx.is_cupy(xp) else None
        self.writer = None  # the thread writing the file when the window closed
        self.written = None  # how many events it wrote
        self.write_when_window_closes = True
        self.marks_ends = False  # a CGDP host marks iteration k + 1 when k's exchange ends (start(host=True))
        self.deadline = None  # the job's collective deadline, which the clock exchanges run under (start(deadline=))
        self.others = []  # parts of other processes handed to this one (absorb)
        self.layer_args = {}  # (id(layer), cat, top shapes) -> the args trace.layer() worked out for them
        self.metadata = {"trace_iterations": list(self.window) if self.window else None}
        self.open = self.window is None

    # -- threads --------------------------------------------------------------------------------------
    def thread_key(self):
        """The calling thread's key, naming its row the first time it records.

        Kept in a ``threading.local`` rather than taken from ``threading.get_ident()``: CPython hands a finished
        thread's ident to the next thread it starts, whose spans would land on the old row.
        """
        key = getattr(self._local, "key", None)
        return key if key is not None else self.name_thread(None)

    def name_thread(self, role):
        """Name the calling thread's row ``role`` (``compute``, ``comm``, ``data``, ``host`` ...; None: from its
        Python name, see THREAD_ROLES); a second thread of the same role is ``role 1``, then ``role 2`` ...
        Returns the thread's key."""
        thread = threading.current_thread()
        if role is None:
            role = next((r for prefix, r in THREAD_ROLES if thread.name.startswith(prefix)), thread.name)
        with self._names_lock:
            key = getattr(self._local, "key", None)
            if key is not None and self.threads[key][1] == role:
                return key
            count = self._roles.get(role, 0)
            self._roles[role] = count + 1
            if key is None:
                key = self._local.key = len(self.threads)
            self.threads[key] = (threading.get_native_id(), role if count == 0 else f"{role} {count}")
        return key

    def synthetic_thread(self, row):
        """The key of a row for spans no thread of this process ran (``"device"``, a non-blocking collective)."""
        key = ("row", row)
        if key not in self.threads:
            with self._names_lock:
                self.threads.setdefault(key, (SYNTHETIC_TID_BASE + len(self.threads), row))
        return key

    # -- the window -----------------------------------------------------------------------------------
    def start_iteration(self, k, now):
        """Iteration ``k`` starts at ``now``: the previous one's "iteration" span ends; the window opens or closes."""
        if self.open and self.iter is not None:
            self.events.append(("iteration", "iteration", self._iter_start, now - self._iter_start,
                                self.thread_key(), self.iter, None))
        was_open = self.open
        self.iter, self._iter_start = k, now
        a, b = self.window if self.window else (None, None)
        self.open = self.window is None or (k >= a and (b is None or k < b))
        if (was_open and not self.open and self.path is not None and self.writer is None
                and self.write_when_window_closes):
            self.writer = threading.Thread(target=self._write_now, name="layerforge-trace-writer", daemon=True)
            self.writer.start()

    def end_iteration(self, now):
        """Close the open "iteration" span (training ended inside the window); on a CGDP host, which marks an
        iteration when the previous one ends, the iteration marked last never ran: it gets no span."""
        if self.open and self.iter is not None and not self.marks_ends:
            self.events.append(("iteration", "iteration", self._iter_start, now - self._iter_start,
                                self.thread_key(), self.iter, None))
        self.iter = None

    def _write_now(self):
        from ..errors import LayerforgeError

        part = self.part(device=False)  # reading CUDA events would wait for the device: that is for the end
        try:
            write_trace(self.path, [part] + self.others)
        except LayerforgeError as e:  # finish() tries again and raises it where the user sees it
            logging.getLogger(LOGGER_NAME).warning("trace: %s (trying again when training ends)", e)
            return
        self.written = (len(part["events"]), len(self.others))

    # -- export ---------------------------------------------------------------------------------------
    def part(self, device=True):
        """This process's spans as one picklable dict (what ranks send to rank 0 and workers to their host);
        with ``device``, the device spans are read first (waiting for the device)."""
        if device and self.device is not None:
            self.events.extend(self.device.collect(self.synthetic_thread("device")))
        return {"pid": self.pid, "process_name": self.process_name, "threads": dict(self.threads),
                "events": list(self.events), "metadata": dict(self.metadata)}


class _Span:
    __slots__ = ("recorder", "cat", "name", "args", "start", "iteration", "device")

    def __init__(self, recorder, cat, name, args):
        if cat not in CATEGORIES:
            raise ValueError(f"trace category {cat!r} is not one of {', '.join(CATEGORIES)}")
        self.recorder, self.cat, self.name, self.args = recorder, cat, name, args

    def __enter__(self):
        rec = self.recorder
        if rec.nvtx is not None:
            rec.nvtx.RangePush(self.name)
        self.device = rec.device.begin() if rec.device is not None else None
        self.iteration = rec.iter  # a span belongs to the iteration it starts in, wherever it ends
        self.start = clock()
        return self

    def __exit__(self, *exc):
        end = clock()
        rec = self.recorder
        if self.device is not None:
            rec.device.end(self.device, self.cat, self.name, self.iteration, self.args)
        if rec.nvtx is not None:
            rec.nvtx.RangePop()
        rec.events.append((self.cat, self.name, self.start, end - self.start, rec.thread_key(), self.iteration,
                           self.args or None))
        return False


def span(cat, name, **args):
    """A context manager recording one span of category ``cat`` named ``name`` (a layer, a bucket, a step).

    ``args`` go into the event (JSON values: type, engine, shapes, bytes ...). Outside the window, or with no
    recorder, it returns :data:`NULL_SPAN`. Keyword arguments are evaluated by the caller even then: pass only
    values at hand, and use :func:`layer` for a layer's shapes and FLOPs.
    """
    if not _active:
        return NULL_SPAN
    rec = _recorder
    return NULL_SPAN if rec is None else _Span(rec, cat, name, args)  # None: stop() ran on another thread


def begin(cat, name, **args):
    """Start a span that :func:`end` closes (on the same thread); returns a token, None when not recording."""
    token = span(cat, name, **args)
    if token is NULL_SPAN:
        return None
    token.__enter__()
    return token


def end(token, **args):
    """Close a span :func:`begin` opened, adding ``args``; ``end(None)`` does nothing."""
    if token is not None:
        if args:
            token.args = {**token.args, **args}
        token.__exit__(None, None, None)


def complete(cat, name, start, dur, args=None, thread=None):
    """Record a span measured elsewhere: ``start`` in :func:`clock` seconds, ``dur`` seconds; it belongs to the
    iteration running when this is called.

    ``thread``: the name of a row of its own (e.g. ``"comm"`` for a non-blocking allreduce that no thread of
    this process runs); default the calling thread's row.
    """
    if not _active:
        return
    if cat not in CATEGORIES:
        raise ValueError(f"trace category {cat!r} is not one of {', '.join(CATEGORIES)}")
    rec = _recorder
    if rec is not None:
        key = rec.thread_key() if thread is None else rec.synthetic_thread(thread)
        rec.events.append((cat, name, start, dur, key, rec.iter, dict(args) if args else None))


class _Wait:
    __slots__ = ("kind", "name", "args", "start", "recorder", "iteration")

    def __init__(self, kind, name, args):
        self.kind, self.name, self.args = kind, name, args

    def __enter__(self):
        rec = self.recorder = _recorder if _active else None
        self.iteration = rec.iter if rec is not None else None
        self.start = clock()
        return self

    def __exit__(self, *exc):
        end = clock()
        _waited[self.kind] += end - self.start
        rec = self.recorder
        if rec is not None:
            rec.events.append((self.kind, self.name, self.start, end - self.start, rec.thread_key(), self.iteration,
                               self.args or None))
        return False


def wait(kind, name="wait", **args):
    """A context manager around time the compute thread waits: for input (``"data"``) or on the gradient
    exchange (``"comm"``: a wait for buckets in flight, or an allreduce run on the compute thread itself).

    Unlike :func:`span` it always measures (two clock reads), so :func:`waited` gives the totals that
    TensorBoard shows whether or not a trace is being recorded; in the window it is also a span.
    """
    if kind not in WAIT_KINDS:
        raise ValueError(f"wait kind {kind!r} is not one of {', '.join(WAIT_KINDS)}")
    return _Wait(kind, name, args)


def waited():
    """``{"data": seconds, "comm": seconds}`` waited in :func:`wait` by this process so far."""
    return dict(_waited)


def layer(cat, layer_obj, bottom, top, **args):
    """:func:`span` for a layer's ``forward`` or ``backward``, named after it, with its type, engine, top
    shapes, top bytes and FLOPs (``2 * multiply_adds`` forward, twice that backward) as ``args``."""
    if not _active:
        return NULL_SPAN
    rec = _recorder
    if rec is None:
        return NULL_SPAN
    shapes = tuple(t.shape for t in top)
    key = (id(layer_obj), cat, shapes)
    fixed = rec.layer_args.get(key)
    if fixed is None:  # shapes, bytes and FLOPs change only with the shapes: worked out once per shape
        fixed = rec.layer_args[key] = _layer_args(cat, layer_obj, bottom, top)
    choice = getattr(layer_obj, "engine_choice", None)  # None until AUTO has settled
    engine = choice.get(cat) if choice else None
    return _Span(rec, cat, layer_obj.name, {**fixed, "engine": engine, **args} if engine else {**fixed, **args})


def _layer_args(cat, layer_obj, bottom, top):
    args = {"type": layer_obj.type, "top": [list(t.shape) for t in top],
            "bytes": int(sum(t.count * t.dtype.itemsize for t in top))}
    try:
        macs = int(layer_obj.multiply_adds(bottom, top))
    except Exception:  # noqa: BLE001 - a layer without a FLOP count still gets its span
        macs = 0
    if macs:
        args["flops"] = (2 if cat == "forward" else 4) * macs
    return args


def iteration(k):
    """Mark the start of solver iteration ``k`` (call it first thing in every iteration, on every rank).

    Opens or closes the window, ends the previous iteration's span, and tags later spans with ``iter: k``.
    """
    global _active
    rec = _recorder
    if rec is None:
        return
    rec.start_iteration(int(k), clock())
    _active = rec.open


def name_thread(role):
    """Name the calling thread's row (call it where a thread starts; layerforge's own threads are named by
    their Python thread names, see THREAD_ROLES)."""
    if _recorder is not None:
        _recorder.name_thread(role)


def active():
    """True while spans are being recorded (a recorder exists and the window is open)."""
    return _active


def current_recorder():
    """The process's :class:`Recorder`, or None when tracing is off."""
    return _recorder


def start(path=None, iterations=DEFAULT_WINDOW, comm=None, pid=None, process_name=None, xp=None,
          device_spans=False, role=None, host=False, deadline=None):
    """Begin tracing this process; returns its :class:`Recorder`.

    Args:
        path: the trace file (see :func:`finish`); None to collect only (a CGDP worker hands its part over).
        iterations: the window ``(A, B)`` (see :func:`parse_window`); spans before the first :func:`iteration`
            call are recorded only when it starts at 0 (or is None: everything).
        comm: the job's mpi4py communicator under ``mpiexec``: a collective call that measures this rank's
            clock offset against rank 0 now (again in :func:`finish`); ``pid`` defaults to the rank, and the
            file is written once, at the end, by rank 0.
        pid, process_name, xp, device_spans: as for :class:`Recorder` (``pid`` default 0 without ``comm``).
        role: the calling thread's row (default ``"compute"``, on a CGDP host ``"host"``).
        host: this is a CGDP host process (layerforge/dataparallel/cgdp/pool.py): its workers' parts come when
            training ends (:func:`absorb`), so the file is written by :func:`finish` only, and it marks
            iteration k + 1 (:func:`iteration`) when iteration k's exchange ends, so the iteration marked last
            when training ends never ran and gets no "iteration" span.
        deadline: the job's collective deadline on ``comm`` (layerforge.comm.deadline's ``deadline_for``), or None:
            the clock exchanges here and in :func:`finish` are collectives of it.
    """
    global _active, _recorder
    several = comm is not None and comm.Get_size() > 1
    if pid is None:
        pid = comm.Get_rank() if comm is not None else 0
    rec = Recorder(path, iterations, pid, process_name, xp, device_spans)
    rec.write_when_window_closes = not several and not host  # under MPI, rank 0 writes everyone's spans at the end
    rec.marks_ends = host
    rec.deadline = deadline
    if several:
        add_clock_point({"metadata": rec.metadata}, clock_point(comm, deadline=deadline))
    if rec.window is not None and rec.window[0] == 0:
        rec.open = True
    rec.name_thread(role or ("host" if host else "compute"))  # by default the thread that starts tracing trains
    _recorder = rec
    _active = rec.open
    return rec


def stop():
    """Stop recording; returns this process's part (see :meth:`Recorder.part`), None when tracing was off."""
    global _active, _recorder
    rec = _recorder
    if rec is None:
        return None
    _active = False
    rec.end_iteration(clock())
    _recorder = None
    if rec.writer is not None:
        rec.writer.join()
    return rec.part()


def finish(comm=None, per_rank=False):
    """Stop tracing and write the trace file; returns the path written (None where this process wrote none).

    One process: it writes its file (unless the writer started when the window closed already wrote every
    span). Call it in a ``finally``, so an interrupted run keeps what it recorded.

    Under ``mpiexec`` (``comm`` of more than one rank) it is a collective call: the clock offsets are measured
    again and every rank's spans go to rank 0, which writes the file on rank 0's clock. With ``per_rank``, each
    rank instead writes ``FILE.rank<R>.json`` with its offsets noted but not applied, for ``layerforge trace
    merge``. Call it after training returns normally: a rank that failed would leave the others waiting.
    """
    rec = _recorder
    if rec is None:
        return None
    part = stop()
    if not part["events"] and not any(p["events"] for p in rec.others) and rec.path:
        window = "all" if rec.window is None else f"{rec.window[0]}:{'' if rec.window[1] is None else rec.window[1]}"
        logging.getLogger(LOGGER_NAME).warning(
            "trace: no iteration of the window %s ran on %s: %s holds no spans (see --trace-iterations)", window,
            rec.process_name, rec.path)
    if comm is not None and comm.Get_size() > 1:
        if per_rank:
            point = clock_point(comm, deadline=rec.deadline)
            for p in [part] + rec.others:  # a host's CGDP workers read its clock
                add_clock_point(p, point)
                p["metadata"]["clock"]["applied"] = False
            return write_trace(rank_path(rec.path, comm.Get_rank()), [part] + rec.others) if rec.path else None
        parts = gather_parts(comm, [part] + rec.others, deadline=rec.deadline)
        return write_trace(rec.path, parts) if parts and rec.path else None
    if rec.path is None:
        return None
    if rec.written == (len(part["events"]), len(rec.others)):
        return rec.path  # the window's writer wrote all of it

    return write_trace(rec.path, [part] + rec.others)


def rank_path(path, rank):
    """``run.json`` -> ``run.rank1.json``: the file one rank writes with ``finish(per_rank=True)``."""
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.json'}"


def absorb(part):
    """Add another process's part (a CGDP worker's, sent to its host) to this process's trace: it is written
    with this process's file, under its own pid. The processes of one host share the clock: no shift."""
    rec = _recorder
    if rec is not None and part is not None:
        rec.others.append(part)


def parse_window(text):
    """``"5:10"`` -> ``(5, 10)`` (iterations 5 to 9), ``"5:"`` -> ``(5, None)`` (from 5 on, unbounded),
    ``"all"`` -> None. Raises ValueError with the reason."""
    text = str(text).strip()
    if text == "all":
        return None
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError
        a, b = int(lo), (int(hi) if hi.strip() else None)
    except ValueError:
        raise ValueError(f"'{text}': expected A:B (iterations A to B-1), A: (from A on) or all") from None
    if a < 0 or (b is not None and b <= a):
        raise ValueError(f"'{text}': need 0 <= A < B")
    return a, b
