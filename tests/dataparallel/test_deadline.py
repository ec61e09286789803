"""A stalled rank (SIGSTOP: a swapped, stopped or stuck process) is named while the others wait, and past the
collective timeout every rank stops with one line naming it and its host, the last snapshot intact."""
import os
import signal
import socket
import sys
import time

import pytest

from layerforge.comm.deadline import EXIT_STATUS
from layerforge.npz import load_npz

from .mpijob import Job, snapshots, train, under_mpiexec, write_solver

pytestmark = pytest.mark.mpi

TIMEOUT = 5  # seconds: short, so that the test is quick, and 2 s past the status line (deadline.STATUS_AFTER)


def _stall_rank_1(job, tmp_path):
    """Stop rank 1's training child once a snapshot exists; returns (its pid, when it was stopped)."""
    job.wait_for(r"Snapshotting to \S+_iter_2\.")
    job.wait_for(r"Iteration 4 \(")
    pid = job.process(1, "child")
    os.kill(pid, signal.SIGSTOP)
    return pid, time.monotonic()


def _ended_naming(job, pid, stopped, tmp_path, code):
    elapsed = time.monotonic() - stopped
    log = job.log
    assert elapsed < TIMEOUT + 15, f"the job took {elapsed:.0f} s to end:\n{log[-3000:]}"
    late = f"rank 1 (host {socket.gethostname()}, pid {pid}; it does not answer: stopped, swapped out or stuck)"
    assert f"{late} is " in log and "s late to the" in log, log[-3000:]  # the status line, while it waits
    ends = [line for line in log.splitlines() if f"within the collective timeout of {TIMEOUT} s" in line]
    assert len(ends) == 1 and ends[0].startswith(f"rank 0: {late} did not reach the "), log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert code == EXIT_STATUS, log[-3000:]
    taken = snapshots(tmp_path)
    assert taken, log[-3000:]
    state = load_npz(str(tmp_path / "snap" / f"net_iter_{taken[-1]}.solverstate.npz"))  # whole: it loads
    assert int(state["iter"]) == taken[-1]


def test_a_stopped_rank_under_mpiexec_is_named_and_ends_the_job(tmp_path):
    solver = write_solver(tmp_path, snapshot=2)
    with Job(under_mpiexec(2, train(solver, "--collective-timeout", TIMEOUT))) as job:
        pid, stopped = _stall_rank_1(job, tmp_path)
        code = job.finish(60)
    _ended_naming(job, pid, stopped, tmp_path, code)


def test_a_stopped_rank_under_ranks_is_named_and_ends_the_job(tmp_path):
    solver = write_solver(tmp_path, snapshot=2, collective_timeout=TIMEOUT)  # the solver key this time
    with Job(train(solver, "--ranks", 2)) as job:
        pid, stopped = _stall_rank_1(job, tmp_path)
        code = job.finish(60)
    _ended_naming(job, pid, stopped, tmp_path, code)


def test_a_rank_killed_inside_a_collective_is_named_once_and_the_others_add_nothing(tmp_path):
    solver = write_solver(tmp_path)
    for _ in range(2):  # the same line and the same exit status, run after run
        with Job(train(solver, "--ranks", 3)) as job:
            job.wait_for(r"Iteration 3 \(")
            pid = job.process(1, "child")
            os.kill(pid, signal.SIGKILL)
            code = job.finish(60)
        log = job.log
        named = f"rank 1 (host {socket.gethostname()}, pid {pid}): killed by signal 9 (SIGKILL)"
        assert log.count(named) == 1, log[-3000:]
        assert "Traceback" not in log and "MPI error" not in log, log[-3000:]
        assert code == 128 + signal.SIGKILL, log[-3000:]


@pytest.mark.parametrize("how, status", [(signal.SIGSTOP, EXIT_STATUS), (signal.SIGKILL, 128 + signal.SIGKILL)])
def test_bare_mpiexec_ends_a_job_with_the_same_status_every_time(tmp_path, how, status):
    """Hydra's own status mixes its ranks' (a bitwise OR of their wait statuses): a stopped rank past the deadline
    used to give 124 or 9, a killed one 137 or 9, by which rank hydra reaped first. The rank that ends the job now has
    hydra exit with its code (launcher.py)."""
    solver = write_solver(tmp_path)
    codes = []
    for _ in range(3):
        with Job(under_mpiexec(2, train(solver, "--collective-timeout", 3))) as job:
            job.wait_for(r"Iteration 3 \(")
            os.kill(job.process(1, "child"), how)
            codes.append(job.finish(60))
    assert codes == [status] * 3, (codes, job.log[-3000:])
    assert "Traceback" not in job.log, job.log[-3000:]


@pytest.mark.parametrize("traced, waits_in", [(True, "the clock exchange of the trace"), (False, "the allreduce")])
def test_a_stopped_rank_ends_time_under_mpiexec(tmp_path, traced, waits_in):
    """``layerforge time``'s collectives (the trace's clock exchanges, the timed exchange's) have the deadline too:
    rank 1 stopped while it times its net leaves rank 0 waiting at the next one, which names it and ends the job."""
    from tests.test_interrupts import write_net

    write_net(tmp_path)
    argv = [sys.executable, "-m", "layerforge", "time", "--model", str(tmp_path / "net.yaml"), "--iterations", "10",
            "--collective-timeout", "3"] + (["--trace", str(tmp_path / "t.json")] if traced else [])
    with Job(under_mpiexec(2, argv), cwd=str(tmp_path)) as job:
        after = job.wait_for(r"Timing net 'slow': forward-backward passes").end()
        job.wait_for(r"Timing net 'slow': forward-backward passes", after=after)  # both ranks time their nets
        pid = job.process(1, "child")
        os.kill(pid, signal.SIGSTOP)
        code = job.finish(60)
    log = job.log
    ends = [line for line in log.splitlines() if "within the collective timeout of 3 s" in line]
    assert len(ends) == 1, log[-3000:]
    assert ends[0].startswith(f"rank 0: rank 1 (host {socket.gethostname()}, pid {pid}; it does not answer: "), ends
    assert f"did not reach {waits_in} (collective " in ends[0], ends
    assert code == EXIT_STATUS and "Traceback" not in log, log[-3000:]


def _worker(job, g, timeout=60):
    """The pid of worker ``g`` of the job's one process (its spawned children, in the order they started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == job.proc.pid and b"spawn_main" in cmdline:
                found.append(int(entry))
        if len(found) > g:
            return sorted(found)[g]
        time.sleep(0.05)
    pytest.fail(f"no worker {g}:\n{job.log[-3000:]}")


@pytest.mark.parametrize("noun, how", [("worker", ["--workers", "2"]), ("replica", ["--cpu-parallel", "REPLICAS"])])
def test_a_stopped_worker_or_replica_is_named_and_ends_the_run(tmp_path, noun, how):
    solver = write_solver(tmp_path, snapshot=2)
    with Job(train(solver, "--collective-timeout", TIMEOUT, *how)) as job:
        job.wait_for(r"Snapshotting to \S+_iter_2\.")
        job.wait_for(r"Iteration 4 \(")
        pid = _worker(job, 1)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        code = job.finish(60)
    elapsed, log = time.monotonic() - stopped, job.log
    assert elapsed < TIMEOUT + 15, f"the run took {elapsed:.0f} s to end:\n{log[-3000:]}"
    late = f"{noun} 1 (host {socket.gethostname()}, pid {pid}; it is stopped (SIGSTOP, or a debugger))"
    assert f"{late} is " in log and f"s late to the wait of the {noun}s" in log, log[-3000:]
    ends = [line for line in log.splitlines() if f"within the collective timeout of {TIMEOUT} s" in line]
    assert len(ends) == 1 and ends[0].startswith(f"{late} did not reach "), log[-3000:]
    assert "Traceback" not in log and code == EXIT_STATUS, log[-3000:]
    taken = snapshots(tmp_path)
    assert taken and int(load_npz(str(tmp_path / "snap" / f"net_iter_{taken[-1]}.solverstate.npz"))["iter"]) == \
        taken[-1]
