"""signal_handlers: a signal is a request; the same effect asked twice while pending is one request; a second
Ctrl-C interrupts at once in one process, never on a rank that agrees on requests with others."""
import os
import signal

import pytest

from layerforge.solvers.signals import signal_handlers


def deliver(*signals):
    for s in signals:
        os.kill(os.getpid(), s)  # a signal to this process is handled before os.kill returns (main thread)


def test_a_request_pending_is_not_made_twice():
    pending = []
    with signal_handlers(pending, "stop", "snapshot"):
        deliver(signal.SIGTERM, signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGHUP)
        assert pending == [(signal.SIGTERM, "stop"), (signal.SIGHUP, "snapshot")]
        pending.pop(0)  # the loop carried the stop out: a new one is a new request
        deliver(signal.SIGINT)
        assert pending == [(signal.SIGHUP, "snapshot"), (signal.SIGINT, "stop")]
    assert pending == [] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("escalate", [True, False])
def test_a_second_ctrl_c_interrupts_only_where_asked(escalate):
    pending = []
    with signal_handlers(pending, "stop", "snapshot", escalate=escalate):
        deliver(signal.SIGINT)
        if escalate:
            with pytest.raises(KeyboardInterrupt):
                deliver(signal.SIGINT)
        else:  # a rank: hydra's Ctrl-C and its supervisor's forwarding are one request
            deliver(signal.SIGINT, signal.SIGINT)
        assert pending == [(signal.SIGINT, "stop")]
