"""Deadlines on the waits of one host's workers (CGDP workers, CPU replicas), as comm/deadline.py gives the ranks.

A worker that waits for the others (a barrier, the replicas' shared sums and outputs, the host's chunks) marks its
row of a shared array with since when (:func:`waiting`; 0 when it does not wait). The parent, which already watches
the workers, looks every :data:`POLL` seconds (:class:`Watch`): once a worker has waited :data:`STATUS_AFTER`
seconds, the workers that do not wait, or that the kernel says are stopped, are late, and it logs them; past the
deadline, counted from the first worker's wait, it kills every worker and ends the run in one line naming the late
one, exit :data:`~layerforge.comm.deadline.EXIT_STATUS`. Snapshots are written whole (a temporary file renamed), so
the last one is intact.
"""
import logging
import socket
import sys
import time

from ...comm.deadline import EXIT_STATUS, STATUS_AFTER, note_late

POLL = 1.0  # seconds between the parent's looks at the workers' waits

log = logging.getLogger("layerforge")
_row = None  # (shared array, this worker's index), set in each worker process


def install(table, g):
    """Make :func:`waiting` mark row ``g`` of ``table`` (in worker ``g``'s process)."""
    global _row
    _row = (table, g)


class waiting:
    """``with waiting(): barrier.wait()``: this worker waits for the others meanwhile."""

    __slots__ = ()

    def __enter__(self):
        if _row is not None:
            _row[0][_row[1]] = time.monotonic()

    def __exit__(self, *exc):
        if _row is not None:
            _row[0][_row[1]] = 0.0
        return False


def _state(pid):
    """The kernel's one-letter state of process ``pid`` (T: stopped), or "?"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


class Watch:
    """The parent's look at the waits of ``procs`` (``table`` their rows), ``timeout`` seconds from the first
    worker's wait (None or 0: no deadline, nothing logged); ``noun``: what the messages call one (worker, replica)."""

    def __init__(self, table, procs, timeout, noun="worker"):
        self.table, self.procs, self.timeout, self.noun = table, procs, timeout, noun
        self.noted = None

    def check(self):
        """Log the late workers, or end the run past the deadline (kills the workers, exits EXIT_STATUS)."""
        if not self.timeout:
            return
        since = list(self.table)
        waiting = [t for t in since if t > 0]
        if not waiting:
            return
        alive = [g for g, p in enumerate(self.procs) if p.is_alive()]
        stopped = {g for g in alive if _state(self.procs[g].pid) in ("T", "t")}
        late = [g for g in alive if since[g] <= 0 or g in stopped]  # a stopped worker may have marked its wait
        first = time.monotonic() - min(waiting)
        if first >= self.timeout:
            who = self._who(late, stopped)[0] if late else f"a {self.noun} (every one waits)"
            for p in self.procs:
                p.kill()
            print(f"{who} did not reach the wait of the {self.noun}s within the collective timeout of "
                  f"{self.timeout:g} s; ending the job (--collective-timeout, docs/distributed.md)",
                  file=sys.stderr, flush=True)
            raise SystemExit(EXIT_STATUS)
        if late and first >= STATUS_AFTER and note_late(self, (min(waiting), late), time.monotonic()):
            who, verb = self._who(late, stopped)
            log.warning("%s %s %.0f s late to the wait of the %ss; the job ends at %g s (collective_timeout)",
                        who, verb, first, self.noun, self.timeout)

    def _who(self, late, stopped):
        host = socket.gethostname()
        parts = []
        for g in late:
            pid = self.procs[g].pid
            why = ("it is stopped (SIGSTOP, or a debugger)" if g in stopped
                   else "it has not got there: busy computing, writing a snapshot, or swapped out")
            parts.append(f"{self.noun} {g} (host {host}, pid {pid}; {why})")
        return " and ".join(parts), "is" if len(parts) == 1 else "are"
