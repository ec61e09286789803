"""Deadlines on collectives: a rank that does not arrive is named while the others wait, and past the deadline the
job ends with one line naming it, as PyTorch's process-group timeout and NCCL's watchdog do.

Every collective of a :class:`~layerforge.comm.Communicator` made with a ``timeout`` runs inside
:meth:`Deadline.collective`, which only numbers it and notes when this rank arrived: the hot path stays a few
attribute writes. Each thread that makes collectives (the training thread, the gradient exchange's) numbers its own,
a lane, which the same thread of every other rank follows. A watchdog thread does the rest, on a duplicate of the
communicator (so its messages never meet the algorithms'), every :data:`POLL` seconds:

* it answers the other ranks' questions about a lane: ``(the number of the last collective this rank entered in it,
  how long it has waited in it or -1)``. It answers while the main thread computes or writes a snapshot too, so a
  rank that does not answer at all is stopped (SIGSTOP, a swapped-out host) or stuck outside Python;
* while this rank has waited more than a second, it asks every other rank, and counts as arrived those whose answer
  carries this collective's number or a later one. The lowest arrived rank logs the late ones after
  :data:`STATUS_AFTER` seconds, and every :data:`STATUS_EVERY` seconds while they stay late
  (``rank 2 (host h, pid p; it does not answer: ...) is 3 s late to the allreduce ...``);
* the deadline counts from the first arrival (the longest wait among the arrived ranks' answers): past it, the lowest
  arrived rank ends the job with ``MPI_Abort`` on COMM_WORLD and one line naming the late ranks and their hosts, exit
  :data:`EXIT_STATUS`, which is then mpiexec's own every time (hydra exits with an aborting rank's code, however it
  ends the stopped ones: launcher.py). Any other waiting rank does the same :data:`GRACE` seconds later, should that
  one be gone.

Snapshots are written whole or not at all (a temporary file renamed), so the job's last snapshot survives the abort.
"""
import atexit
import logging
import os
import socket
import threading
import time
import zlib

import numpy

from .guard import DEADLINE_STATUS, abort

DEFAULT_TIMEOUT = 600.0  # seconds; PyTorch's NCCL process groups and NCCL's watchdog default to 10 minutes too
STATUS_AFTER = 3.0  # seconds a collective waits before the late ranks are named in the log
STATUS_EVERY = 60.0  # seconds between two such lines while the same ranks stay late
POLL = 0.2  # seconds between the watchdog's looks (questions are answered within this)
ASK_AFTER = 1.0  # seconds of waiting before the watchdog asks the others where they are
GRACE = 5.0  # seconds the other waiting ranks leave the reporting one before they end the job themselves
EXIT_STATUS = DEADLINE_STATUS  # 124, a collective ran past its deadline (the status GNU timeout uses)
_QUESTION, _ANSWER = 1, 2

log = logging.getLogger("layerforge")


class _Lane:
    """The collectives one thread makes (the training thread's, the gradient exchange's): numbered in the order it
    makes them, which every rank's thread of the same name follows too. ``since``: when this rank arrived at the
    one it is in (None: in none); ``what`` its name for the messages. The lane is its own context (a class, cheaper
    than a generator per collective)."""

    __slots__ = ("key", "seq", "depth", "since", "what", "asked", "answers", "noted")

    def __init__(self, key):
        self.key, self.seq, self.depth, self.since, self.what = key, 0, 0, None, None
        self.asked, self.answers, self.noted = 0.0, {}, None

    def __enter__(self):
        self.depth += 1
        if self.depth == 1:
            self.seq += 1
            self.since = time.monotonic()

    def __exit__(self, *exc):
        self.depth -= 1
        if self.depth == 0:
            self.since = None
        return False


class Deadline:
    """The deadline of the collectives on mpi4py communicator ``comm`` (``timeout`` seconds from the first rank's
    arrival), with its watchdog thread; one per process and communicator, made by every rank at once
    (:func:`deadline_for`)."""

    def __init__(self, comm, timeout):
        self.timeout = float(timeout)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.lanes = {}  # thread name -> _Lane
        self.ctl = comm.Dup()
        self.peers = self.ctl.allgather((socket.gethostname(), os.getpid()))
        self._sends = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="layerforge-deadline", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # before MPI_Finalize (mpi4py registered its own first, so it runs later)

    def collective(self, what):
        """Context around one collective of the calling thread (nested ones count once)::

            with deadline.collective("allreduce"): ...
        """
        name = threading.current_thread().name
        lane = self.lanes.get(name)
        if lane is None:
            lane = self.lanes[name] = _Lane(zlib.crc32(name.encode()))
        if lane.depth == 0:
            lane.what = what
        return lane

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
                self._collect(MPI, status)
                for lane in list(self.lanes.values()):
                    since, seq = lane.since, lane.seq
                    if since is not None:
                        self._check(lane, seq, time.monotonic() - since)
                self._sends = [(req, buf) for req, buf in self._sends if not req.Test()]
            except MPI.Exception:  # the job is being torn down (a peer died): the main thread reports it
                return

    def _send(self, buf, dest, tag):
        self._sends.append((self.ctl.Isend(buf, dest, tag), buf))

    def _lane(self, key):
        return next((lane for lane in list(self.lanes.values()) if lane.key == key), None)

    def _answer(self, MPI, status):
        """Answer each question ``[lane]`` with ``[lane, seq, waited or -1]`` (seq 0: no collective in it yet)."""
        while self.ctl.Iprobe(MPI.ANY_SOURCE, _QUESTION, status):
            source, got = status.Get_source(), numpy.empty(1, numpy.float64)
            self.ctl.Recv(got, source, _QUESTION)
            lane = self._lane(int(got[0]))
            since = None if lane is None else lane.since
            waited = -1.0 if since is None else time.monotonic() - since
            self._send(numpy.array([got[0], 0 if lane is None else lane.seq, waited], numpy.float64), source,
                       _ANSWER)

    def _collect(self, MPI, status):
        now = time.monotonic()
        while self.ctl.Iprobe(MPI.ANY_SOURCE, _ANSWER, status):
            source, got = status.Get_source(), numpy.empty(3, numpy.float64)
            self.ctl.Recv(got, source, _ANSWER)
            lane = self._lane(int(got[0]))
            if lane is not None:
                lane.answers[source] = (int(got[1]), float(got[2]), now)

    def _check(self, lane, seq, waited):
        now = time.monotonic()
        if waited >= ASK_AFTER and now - lane.asked >= 1.0:
            lane.asked = now
            for r in range(self.size):
                if r != self.rank:
                    self._send(numpy.array([lane.key], numpy.float64), r, _QUESTION)
        if waited < ASK_AFTER + 2 * POLL:
            return  # the answers to the first question are still coming
        fresh = {r: a for r, a in lane.answers.items() if now - a[2] <= min(waited, 3.0)}
        arrived = [self.rank] + [r for r, (s, _, _) in fresh.items() if s >= seq]
        late = [r for r in range(self.size) if r not in arrived]
        first = max([waited] + [w + now - t for s, w, t in fresh.values() if s == seq and w >= 0])
        reporter = min(arrived) == self.rank
        if late and reporter and waited >= STATUS_AFTER and note_late(lane, (seq, late), now):
            who, verb = self._who(late, fresh)
            log.warning("%s %s %.0f s late to the %s (collective %d); the job ends at %s (collective_timeout)",
                        who, verb, first, lane.what, seq, f"{self.timeout:g} s")
        if first >= self.timeout and (reporter or waited >= self.timeout + GRACE):
            who = self._who(late, fresh)[0] if late else "a rank (every one answers)"
            abort(f"{who} did not reach the {lane.what} (collective {seq}) within the collective timeout of "
                  f"{self.timeout:g} s; ending the job (--collective-timeout, docs/distributed.md)",
                  EXIT_STATUS)

    def _who(self, late, fresh):
        """``("rank 2 (host h, pid p; it does not answer: stopped, swapped out or stuck)", "is")`` and the like."""
        parts = []
        for r in late:
            host, pid = self.peers[r]
            why = ("it answers but has not got there: busy computing, or writing a snapshot" if r in fresh
                   else "it does not answer: stopped, swapped out or stuck")
            parts.append(f"rank {r} (host {host}, pid {pid}; {why})")
        return " and ".join(parts), "is" if len(parts) == 1 else "are"


def note_late(holder, what, now):
    """True when ``what`` (the late ones at a wait) should be logged: new, or last logged STATUS_EVERY s ago;
    ``holder.noted`` keeps ``(what, when)``."""
    if holder.noted is not None and holder.noted[0] == what and now - holder.noted[1] < STATUS_EVERY:
        return False
    holder.noted = (what, now)
    return True


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
