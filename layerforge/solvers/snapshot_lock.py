"""One training run per snapshot prefix: ``PREFIX.lock`` while a run may write ``PREFIX_iter_N.*``.

Two runs with the same ``snapshot_prefix`` would replace each other's snapshots without a word (the log of one
names a file that holds the other's weights). The process that writes snapshots (rank 0, replica 0) holds the
lock from the start of :meth:`Solver.solve` to its end, however it ends (return, error, Ctrl-C):

- the file says who holds it (host, pid, solver file, start time), for the one line that refuses a second run;
- an exclusive ``flock`` on it is what holds it: the kernel lets it go when the process dies, even by SIGKILL, so
  a lock that nobody holds any more (its file left behind) is taken over, with a warning naming the run that left
  it. A lock whose flock is still held (by the children of a dead run that inherited it) is taken over too when its
  pid is gone from this host.
"""
import errno
import fcntl
import json
import logging
import multiprocessing
import os
import socket
import time

from ..errors import LayerforgeError
from ..npz import check_writable

log = logging.getLogger("layerforge")

_HELD = {}  # lock path -> [fd, count]: the locks this process holds (a second solve in it shares the hold)


class SnapshotLock:
    """The hold of one process on ``path``; :meth:`release` ends it (once)."""

    def __init__(self, path):
        self.path = path

    def release(self):
        held = _HELD.get(self.path)
        if held is None:
            return
        held[1] -= 1
        if held[1]:
            return
        del _HELD[self.path]
        fd = held[0]
        try:
            if _same_file(fd, self.path):
                os.unlink(self.path)  # while it is locked: whoever opens it later makes a new one
        except OSError:
            pass
        os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def lock_path(prefix):
    """The lock file of the snapshots ``PREFIX_iter_N.*``."""
    return os.path.abspath(prefix) + ".lock"


def describe(info):
    """``host H, pid P, solver S`` of a lock's contents, in words for a message."""
    if not info:
        return "a run that left no details"
    parent = f" (a worker of pid {info['parent']})" if info.get("parent") else ""
    return (f"host {info.get('host', '?')}, pid {info.get('pid', '?')}{parent}, solver {info.get('solver') or '?'}"
            + (f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info['started']))}"
               if isinstance(info.get("started"), (int, float)) else ""))


def acquire(prefix, solver_file, what):
    """Hold the snapshot lock of ``prefix`` for this process; returns a :class:`SnapshotLock`.

    Raises a one-line LayerforgeError (``what``: the solver file and key, for the message) when another live run
    holds it, or when its folder cannot be written.
    """
    path = lock_path(prefix)
    check_writable(os.path.dirname(path), f"{what} '{prefix}'")
    if path in _HELD:
        _HELD[path][1] += 1
        return SnapshotLock(path)
    mine = {"host": socket.gethostname(), "pid": os.getpid(),
            "solver": os.path.abspath(solver_file) if solver_file else None, "started": time.time()}
    parent = multiprocessing.parent_process()  # a worker of a run (CPU replicas, CGDP): the run's pid too
    if parent is not None:
        mine["parent"] = parent.pid
    for _ in range(100):  # another process may unlink or replace the file between our open and our flock
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as e:
            raise LayerforgeError(f"{what} '{prefix}': cannot create the snapshot lock {path}: {e.strerror}") \
                from None
        locked, info = _try_flock(fd), _read(fd)
        if locked is None:  # a file system without locks: the pid in the file decides
            locked = not info or _dead_here(info) or (info.get("host"), info.get("pid")) == (mine["host"], mine["pid"])
        if not _same_file(fd, path):
            os.close(fd)
            continue
        if not locked and not _dead_here(info):
            os.close(fd)
            raise LayerforgeError(
                f"{what} '{prefix}': another run writes snapshots under this prefix ({describe(info)}); "
                f"give this run another snapshot_prefix, or stop that one (lock file {path})")
        if not locked:  # held by what a dead run left running (children that inherited the lock): a new file
            _unlink_if_same(fd, path)
            os.close(fd)
            log.warning("Taking over the snapshot lock %s of a run that is gone (%s)", path, describe(info))
            info = None
            continue
        if info and (info.get("host"), info.get("pid")) != (mine["host"], mine["pid"]):
            log.warning("Taking over the snapshot lock %s of a run that is gone (%s)", path, describe(info))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(mine) + "\n").encode(), 0)
        _HELD[path] = [fd, 1]
        return SnapshotLock(path)
    raise LayerforgeError(f"{what} '{prefix}': the snapshot lock {path} keeps changing; is another run starting?")


def _try_flock(fd):
    """True when this process now holds the flock of ``fd``, False when another does, None where the file system
    has no locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        return False if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None


def _read(fd):
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        info = json.loads(text) if text.strip() else None
        return info if isinstance(info, dict) else None
    except (OSError, ValueError):
        return None


def _same_file(fd, path):
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _unlink_if_same(fd, path):
    if _same_file(fd, path):
        try:
            os.unlink(path)
        except OSError:
            pass


def _dead_here(info):
    """Whether the lock's holder ran on this host and its pid is gone."""
    if not info or info.get("host") != socket.gethostname() or not isinstance(info.get("pid"), int):
        return False
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False
