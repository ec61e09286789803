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
ends the command at once: errors.interrupting turns it into errors.Interrupted, which the ``layerforge`` command
reports in one line (``interrupted by SIGTERM``) and exits 128 + the signal's number (130, 143), as a shell
reports a process a signal ended; a trial inside ``interrupting`` is never taken cut short.
"""
import contextlib
import signal
import threading

from ..errors import LayerforgeError

EFFECTS = ("snapshot", "stop", "none")
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

