"""Signals during training, as Caffe's SignalHandler: SIGINT / SIGTERM and SIGHUP request an effect
(``snapshot``, ``stop`` or ``none``) that the loop carries out between two iterations, never inside one.

A request already pending is not made twice: under mpiexec one signal can reach a rank by two ways (hydra
signals the rank's process group, a scheduler every process of the job, the rank's supervisor forwards what it
gets), and the same effect asked twice before the loop gets to it is one request.

In one process, a second SIGINT while one is pending interrupts at once (KeyboardInterrupt), for a user whose
first Ctrl-C waits behind a long iteration. ``escalate=False`` (a rank under mpiexec) never interrupts: a rank
that raised would abort the job without a snapshot, and hydra has its own second Ctrl-C ("Press Ctrl-C again
to force abort"), which ends every rank.

Outside the training loop (start-up, the CPU-parallelism trial, ``time``, ``test``, ``plan``) a SIGINT or SIGTERM
ends the command at once: :func:`interrupting` turns it into :class:`Interrupted`, which the ``layerforge`` command
reports in one line (``interrupted by SIGTERM``) and exits 128 + the signal's number (130, 143), as a shell
reports a process a signal ended; a trial inside :func:`interrupting` is never taken cut short.
"""
import contextlib
import signal
import threading

from ..errors import LayerforgeError

EFFECTS = ("snapshot", "stop", "none")
ENDING = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM that ends a command outside the training loop; ``signum``: which."""

    def __init__(self, signum=signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def exit_status(self):
        """128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a shell reports it."""
        return 128 + self.signum


def exit_status(interrupt):
    """The exit status of a command that a KeyboardInterrupt (or :class:`Interrupted`) ended."""
    return getattr(interrupt, "exit_status", 128 + signal.SIGINT)


_ending = []  # the signal that is ending this process, once one came within :func:`interrupting`
_depth = [0]


def _interrupt(signum, frame):
    if not _ending:  # one Interrupted per process: a copy that follows (a decode worker forwards its Ctrl-C) is moot
        _ending.append(signum)
        raise Interrupted(signum)


@contextlib.contextmanager
def interrupting():
    """Within the block, SIGINT and SIGTERM raise :class:`Interrupted` (the previous handlers are back after it,
    unless the block left others in place: a rank's ``then_ignore``).
    A signal that came during the block wins over whatever the block did: when the block returns, or raises
    something else (a worker that the same Ctrl-C killed, a trial that fails because of it), Interrupted is raised
    instead, so that no caller takes a cut-short result, or the failure it caused, for a real one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = list(_ending)
    old = {s: signal.signal(s, _interrupt) for s in ENDING}
    _depth[0] += 1
    try:
        yield
    except Interrupted:
        raise
    except BaseException as e:
        if _ending and not before:
            raise Interrupted(_ending[0]) from e
        raise
    else:
        if _ending and not before:
            raise Interrupted(_ending[0])
    finally:
        for s, h in old.items():
            if signal.getsignal(s) is _interrupt:  # what a block set for after itself (then_ignore) stays
                signal.signal(s, h)
        _depth[0] -= 1
        if not _depth[0]:
            _ending.clear()


@contextlib.contextmanager
def signal_handlers(pending, sigint_effect, sighup_effect, escalate=True, then_ignore=False):
    """Within the block, each handled signal appends ``(signal number, effect)`` to the list ``pending``, unless
    that effect is pending already; ``escalate``: a second SIGINT while one is pending raises KeyboardInterrupt.
    After the block the previous handlers are back, or with ``then_ignore`` the signals are ignored: for a process
    that ends after the block (a rank under mpiexec), where a late copy of a request already carried out must not
    kill it while it finishes."""
    for name, effect in (("sigint_effect", sigint_effect), ("sighup_effect", sighup_effect)):
        if effect not in EFFECTS:
            raise LayerforgeError(f"{name} must be one of {', '.join(EFFECTS)}, got {effect!r}")
    wanted = {signal.SIGINT: sigint_effect, signal.SIGTERM: sigint_effect}
    if hasattr(signal, "SIGHUP"):
        wanted[signal.SIGHUP] = sighup_effect
    wanted = {s: e for s, e in wanted.items() if e != "none"}
    if threading.current_thread() is not threading.main_thread():
        wanted = {}  # Python delivers signals to the main thread only

    def handler(signum, frame):
        effect = wanted[signum]
        if any(e == effect for _, e in pending):
            if escalate and signum == signal.SIGINT and any(s == signum for s, _ in pending):
                raise KeyboardInterrupt
            return
        pending.append((signum, effect))

    old = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, signal.SIG_IGN if then_ignore else h)
        pending.clear()

