"""Deadlines on collectives: a rank that does not arrive is named while the others wait, and past the deadline the
job ends with one line naming it, as PyTorch's process-group timeout and NCCL's watchdog do.

Every collective of a :class:`~layerforge.comm.Communicator` made with a ``timeout`` runs inside
:meth:`Deadline.collective`, which only numbers it and notes when this rank arrived: the hot path stays a few
attribute writes. A watchdog thread does the rest, on a duplicate of the communicator (so its messages never meet
the algorithms'), every :data:`POLL` seconds:

* it answers the other ranks' questions: ``(the number of the last collective this rank entered, how long it has
  waited in it or -1)``. The thread answers while the main thread computes or writes a snapshot, so a rank that does
  not answer at all is stopped (SIGSTOP, a swapped-out host) or stuck outside Python;
* while this rank has waited more than a second, it asks every other rank, and counts as arrived those whose answer
  carries this collective's number or a later one. The lowest arrived rank logs the late ones after
  :data:`STATUS_AFTER` seconds (``rank 2 (host h, pid p; it does not answer: ...) is 3 s late to the allreduce``);
* the deadline counts from the first arrival (the longest wait among the arrived ranks' answers): past it, the lowest
  arrived rank ends the job with ``MPI_Abort`` and one line naming the late ranks and their hosts, exit
  :data:`EXIT_STATUS`. Any other waiting rank does the same :data:`GRACE` seconds later, should that one be gone.

Snapshots are written whole or not at all (a temporary file renamed), so the job's last snapshot survives the abort.
"""
import atexit
import logging
import os
import socket
import threading
import time

import numpy

DEFAULT_TIMEOUT = 600.0  # seconds; PyTorch's NCCL process groups and NCCL's watchdog default to 10 minutes too
STATUS_AFTER = 3.0  # seconds a collective waits before the late ranks are named in the log
POLL = 0.2  # seconds between the watchdog's looks (questions are answered within this)
ASK_AFTER = 1.0  # seconds of waiting before the watchdog asks the others where they are
GRACE = 5.0  # seconds the other waiting ranks leave the reporting one before they end the job themselves
EXIT_STATUS = 124  # a collective ran past its deadline (the status GNU timeout uses)
_QUESTION, _ANSWER = 1, 2

log = logging.getLogger("layerforge")


def describe_timeout(seconds):
    return f"{seconds:g} s"


class _Arrival:
    """The context :meth:`Deadline.collective` returns (a class, cheaper than a generator per collective)."""

    __slots__ = ("deadline", "what")

    def __init__(self, deadline, what):
        self.deadline, self.what = deadline, what

    def __enter__(self):
        d = self.deadline
        d.depth += 1
        if d.depth == 1:
            d.seq += 1
            d.what = self.what
            d.since = time.monotonic()

    def __exit__(self, *exc):
        d = self.deadline
        d.depth -= 1
        if d.depth == 0:
            d.since = None
        return False


class Deadline:
    """The deadline of the collectives on mpi4py communicator ``comm`` (``timeout`` seconds from the first rank's
    arrival), with its watchdog thread; one per process and communicator, made by every rank at once
    (:func:`deadline_for`)."""

    def __init__(self, comm, timeout):
        self.timeout = float(timeout)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.seq, self.depth, self.since, self.what = 0, 0, None, None
        self.ctl = comm.Dup()
        self.peers = self.ctl.allgather((socket.gethostname(), os.getpid()))
        self._sends, self._answers, self._asked = [], {}, 0.0
        self._noted = None  # (seq, late) last logged
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="layerforge-deadline", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # before MPI_Finalize (mpi4py registered its own first, so it runs later)

    def collective(self, what):
        """Context around one collective (nested ones count once): ``with deadline.collective("allreduce"): ...``."""
        return _Arrival(self, what)

    def close(self):
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    # -- the watchdog thread ----------------------------------------------------------------------------------------
    def _watch(self):
        from mpi4py import MPI

        status = MPI.Status()
        while not self._stop.wait(POLL):
            try:
                self._answer(MPI, status)
                since, seq = self.since, self.seq
                if since is not None:
                    self._check(MPI, status, seq, time.monotonic() - since)
                self._sends = [(req, buf) for req, buf in self._sends if not req.Test()]
            except MPI.Exception:  # the job is being torn down (a peer died): the main thread reports it
                return

    def _send(self, buf, dest, tag):
        self._sends.append((self.ctl.Isend(buf, dest, tag), buf))

    def _answer(self, MPI, status):
        while self.ctl.Iprobe(MPI.ANY_SOURCE, _QUESTION, status):
            source = status.Get_source()
            self.ctl.Recv(numpy.empty(1, numpy.float64), source, _QUESTION)
            since = self.since
            waited = -1.0 if since is None else time.monotonic() - since
            self._send(numpy.array([self.seq, waited], numpy.float64), source, _ANSWER)

    def _check(self, MPI, status, seq, waited):
        now = time.monotonic()
        if waited >= ASK_AFTER and now - self._asked >= 1.0:
            self._asked = now
            for r in range(self.size):
                if r != self.rank:
                    self._send(numpy.zeros(1, numpy.float64), r, _QUESTION)
        while self.ctl.Iprobe(MPI.ANY_SOURCE, _ANSWER, status):
            source, got = status.Get_source(), numpy.empty(2, numpy.float64)
            self.ctl.Recv(got, source, _ANSWER)
            self._answers[source] = (int(got[0]), float(got[1]), now)
        if waited < ASK_AFTER + 2 * POLL:
            return  # the answers to the first question are still coming
        fresh = {r: a for r, a in self._answers.items() if now - a[2] <= min(waited, 3.0)}
        arrived = [self.rank] + [r for r, (s, _, _) in fresh.items() if s >= seq]
        late = [r for r in range(self.size) if r not in arrived]
        first = max([waited] + [w + now - t for s, w, t in fresh.values() if s == seq and w >= 0])
        reporter = min(arrived) == self.rank
        if late and reporter and waited >= STATUS_AFTER and self._noted != (seq, late):
            self._noted = (seq, late)
            who, verb = self._who(late, fresh)
            log.warning("%s %s %.0f s late to the %s (collective %d); the job ends at %s (collective_timeout)",
                        who, verb, first, self.what, seq, describe_timeout(self.timeout))
        if first >= self.timeout and (reporter or waited >= self.timeout + GRACE):
            from .guard import abort

            who = self._who(late, fresh)[0] if late else "a rank (every one answers)"
            abort(f"{who} did not reach the {self.what} (collective {seq}) within the collective timeout of "
                  f"{describe_timeout(self.timeout)}; ending the job (--collective-timeout, docs/distributed.md)",
                  EXIT_STATUS, self.ctl)

    def _who(self, late, fresh):
        """``("rank 2 (host h, pid p; it does not answer: stopped, swapped out or stuck)", "is")`` and the like."""
        parts = []
        for r in late:
            host, pid = self.peers[r]
            why = ("it answers but has not got there: busy computing, or writing a snapshot" if r in fresh
                   else "it does not answer: stopped, swapped out or stuck")
            parts.append(f"rank {r} (host {host}, pid {pid}; {why})")
        return " and ".join(parts), "is" if len(parts) == 1 else "are"


_DEADLINES = {}


def deadline_for(comm, timeout):
    """The :class:`Deadline` of mpi4py communicator ``comm`` (made once, by every rank of it together: call it where
    every rank does), or None for one rank or no ``timeout``."""
    if not timeout or comm.Get_size() == 1:
        return None
    key = comm.py2f()
    found = _DEADLINES.get(key)
    if found is None or found.timeout != float(timeout):
        if found is not None:
            found.close()
        found = _DEADLINES[key] = Deadline(comm, timeout)
    return found
