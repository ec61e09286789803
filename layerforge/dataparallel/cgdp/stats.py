"""Per-iteration phases (the paper's Table 3) and per-chunk transfer times (its Table 4) of a worker.

Phases: ``forward``, ``backward`` (compute, including handing chunks to the copy thread), ``exchange`` (the
*exposed* exchange time: what the main thread waits for after backward, plus tree mode's broadcast),
``update`` and the whole ``iteration``. Chunk rows: ``copy_out`` (diffs -> host slot), ``copy_back``
(accumulated chunk -> diffs); the parent adds ``accumulate``.
"""
import threading
import time

from ...solvers.seam import Seam

PHASES = ("forward", "backward", "exchange", "update", "iteration")


class PhaseTimer(Seam):
    """Collects the phases of every iteration of one worker; :meth:`install` times the train net's forward and
    backward passes, and as the solver's last seam it sees the update between :meth:`before_update` and
    :meth:`after_update` and the iteration's end (after the other seams' waits) at :meth:`end_iteration`."""

    def __init__(self):
        self.current = dict.fromkeys(PHASES, 0.0)
        self.rows = []
        self.chunks = {}  # (kind, chunk name) -> [seconds, count]
        self.chunk_size = None
        self.layer_backward = {}  # layer index -> seconds (the passes that send chunks, HostSync)
        self.lock = threading.Lock()
        self._exchange_end = self._iter_start = self._pass_start = None

    def add(self, phase, seconds):
        self.current[phase] += seconds

    def add_chunk(self, kind, name, seconds):
        with self.lock:
            rec = self.chunks.setdefault((kind, name), [0.0, 0])
            rec[0] += seconds
            rec[1] += 1

    def install(self, solver):
        """Time the forward and backward passes of ``solver``'s train net (through its hooks); returns the timer,
        the seam to add last."""
        solver.net.add_hooks(passes=self._pass)
        return self

    def _pass(self, direction, finished):
        now = time.perf_counter()
        if not finished:
            if self._iter_start is None and direction == "forward":
                self._iter_start = now
            self._pass_start = now
        else:
            self.add(direction, now - self._pass_start)

    def before_update(self):
        self._exchange_end = time.perf_counter()  # the other seams' exchange is done
        return True

    def after_update(self):
        self.add("update", time.perf_counter() - self._exchange_end)

    def end_iteration(self, iteration, loss):
        now = time.perf_counter()
        self.current["iteration"] = now - (self._iter_start or now)
        self.current["chunk_size"] = self.chunk_size
        self.rows.append(self.current)
        self.current = dict.fromkeys(PHASES, 0.0)
        self._iter_start = None

    def summary(self, skip=1):
        """Mean phases in ms over the iterations after the first ``skip`` (warm-up), and chunk rows."""
        rows = self.rows[skip:] or self.rows
        means = {p: 1000.0 * sum(r[p] for r in rows) / len(rows) for p in PHASES} if rows else {}
        chunks = {f"{kind}:{name}": 1000.0 * s / n for (kind, name), (s, n) in self.chunks.items() if n}
        n = len(self.rows) or 1
        layers = {i: 1000.0 * t / n for i, t in self.layer_backward.items()}
        return {"phases_ms": means, "chunks_ms": chunks, "iterations": len(rows),
                "chunk_size": self.chunk_size, "layer_backward_ms": layers}
