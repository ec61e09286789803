"""signal_handlers: a signal is a request; the same effect asked twice while pending is one request; a second
Ctrl-C interrupts at once in one process, never on a rank that agrees on requests with others."""
import os
import signal
import threading

import pytest

from layerforge.solvers.signals import signal_handlers


def deliver(*signals):
    for s in signals:
        os.kill(os.getpid(), s)  # a signal to this process is handled before os.kill returns (main thread)


def test_a_request_pending_is_not_made_twice():
    before = signal.getsignal(signal.SIGINT)  # Python's KeyboardInterrupt handler, or SIG_IGN in a background job
    pending = []
    with signal_handlers(pending, "stop", "snapshot"):
        deliver(signal.SIGTERM, signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGHUP)
        assert pending == [(signal.SIGTERM, "stop"), (signal.SIGHUP, "snapshot")]
        pending.pop(0)  # the loop carried the stop out: a new one is a new request
        deliver(signal.SIGINT)
        assert pending == [(signal.SIGHUP, "snapshot"), (signal.SIGINT, "stop")]
    assert pending == [] and signal.getsignal(signal.SIGINT) is before


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


def test_a_rank_ignores_a_late_copy_of_a_request_it_has_carried_out():
    """A rank stops when the others ask; its own copy of the signal, forwarded late by its supervisor, then comes
    while MPI finalises and must not kill it (exit by SIGTERM, the job reported as failed)."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        pending = []
        with signal_handlers(pending, "stop", "snapshot", escalate=False, then_ignore=True):
            deliver(signal.SIGTERM)
            assert pending == [(signal.SIGTERM, "stop")]
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in before)
        deliver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # would end this test run with the old handlers
        assert pending == []
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_outside_the_loop_a_signal_ends_the_block_and_wins_over_what_it_caused():
    """interrupting(): SIGTERM raises Interrupted (exit status 143); a failure the signal caused (a worker it ended)
    is reported as the signal, and a second copy of it (a decode worker forwards its Ctrl-C) is moot."""
    from layerforge.errors import LayerforgeError
    from layerforge.errors import Interrupted, interrupting

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Interrupted) as ended:
        with interrupting():
            deliver(signal.SIGTERM)
    assert ended.value.signum == signal.SIGTERM and ended.value.exit_status == 143
    with pytest.raises(Interrupted) as ended:
        with interrupting():
            try:
                deliver(signal.SIGINT)
            except Interrupted:
                deliver(signal.SIGTERM)  # moot: this process is ending already
                raise LayerforgeError("worker 1 (pid 7) was killed by signal 2; the job was stopped") from None
    assert ended.value.signum == signal.SIGINT and ended.value.exit_status == 130
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_rank_s_then_ignore_outlasts_interrupting():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    from layerforge.errors import interrupting

    try:
        with interrupting():
            with signal_handlers([], "stop", "snapshot", escalate=False, then_ignore=True):
                pass
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # a late copy must not kill the finishing rank
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_an_interrupt_deferred_is_raised_as_the_outermost_deferring_block_ends():
    """deferring_interrupts(): steps that must not part (a shared memory segment made, then recorded for its cleanup)
    all run; the signal that came among them is raised after them, once; a later copy is moot."""
    from layerforge.errors import Interrupted, deferring_interrupts, interrupting

    steps = []
    with pytest.raises(Interrupted) as ended:
        with interrupting():
            with deferring_interrupts():
                with deferring_interrupts():
                    deliver(signal.SIGTERM)
                    steps.append("made")
                steps.append("recorded")
                deliver(signal.SIGINT)  # moot: the SIGTERM ends this process
            steps.append("after")
    assert steps == ["made", "recorded"] and ended.value.signum == signal.SIGTERM


def test_another_thread_s_deferring_block_defers_nothing_of_the_main_thread():
    """Signals interrupt the main thread only: a block in another thread (a pool run there) must not hold them."""
    from layerforge.errors import Interrupted, deferring_interrupts, interrupting

    entered, leave = threading.Event(), threading.Event()

    def hold():
        with deferring_interrupts():
            entered.set()
            leave.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert entered.wait(30)
        with pytest.raises(Interrupted):
            with interrupting():
                deliver(signal.SIGTERM)
                pytest.fail("SIGTERM was deferred")
    finally:
        leave.set()
        thread.join(30)
