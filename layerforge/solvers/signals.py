"""Signals during training, as Caffe's SignalHandler: SIGINT / SIGTERM and SIGHUP request an effect
(``snapshot``, ``stop`` or ``none``) that the loop carries out between two iterations, never inside one.
A second SIGINT while one is pending interrupts at once (KeyboardInterrupt).
"""
import contextlib
import signal
import threading

from ..errors import LayerforgeError

EFFECTS = ("snapshot", "stop", "none")


@contextlib.contextmanager
def signal_handlers(pending, sigint_effect, sighup_effect):
    """Within the block, each handled signal appends ``(signal number, effect)`` to the list ``pending``."""
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
        if signum == signal.SIGINT and any(s == signum for s, _ in pending):
            raise KeyboardInterrupt
        pending.append((signum, wanted[signum]))

    old = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        pending.clear()
