"""Collectives with a deadline: a rank stopped (SIGSTOP) before an allreduce is named while the others wait, and the
job ends within the deadline, counted from the first rank's arrival, with one line naming it and its host."""
import socket
import time

import pytest

from layerforge.comm.deadline import EXIT_STATUS

from .mpirun import WORKER, run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
def test_a_stopped_rank_is_named_and_the_job_ends_within_the_deadline(algorithm):
    t0 = time.monotonic()
    proc = run_mpi(3, [WORKER, "stall", "5", algorithm], timeout=60)
    elapsed = time.monotonic() - t0
    assert elapsed < 5 + 15, f"the job took {elapsed:.0f} s:\n{proc.stderr[-2000:]}"
    late = f"rank 1 (host {socket.gethostname()}, pid "
    waiting = [line for line in proc.stderr.splitlines() if line.startswith(late) and "s late to the allreduce" in line]
    assert len(waiting) == 1 and "it does not answer: stopped, swapped out or stuck" in waiting[0], proc.stderr
    ends = [line for line in proc.stderr.splitlines() if "within the collective timeout of 5 s" in line]
    assert len(ends) == 1 and ends[0].startswith(f"rank 0: {late}"), proc.stderr
    assert "did not reach the allreduce (collective 11)" in ends[0]
    assert proc.returncode == EXIT_STATUS, proc.stderr  # the reporter's abort is mpiexec's status


@pytest.mark.mpi
def test_a_busy_rank_is_told_from_a_stopped_one():
    proc = run_mpi(2, [WORKER, "stall", "5", "recursive", "busy"], timeout=60)
    ends = [line for line in proc.stderr.splitlines() if "within the collective timeout of 5 s" in line]
    assert len(ends) == 1, proc.stderr
    assert ends[0].startswith(f"rank 0: rank 1 (host {socket.gethostname()}, pid "), proc.stderr
    assert "it answers but has not got there: busy computing, or writing a snapshot" in ends[0]


def test_the_command_line_sets_the_solver_key(tmp_path):
    from layerforge.cli import build_parser
    from layerforge.commands.train import solver_overrides
    from layerforge.solvers.keys import SOLVER_KEYS

    args = build_parser("train").parse_args(["train", "--solver", "s.yaml", "--collective-timeout", "30"])
    assert solver_overrides(args)["collective_timeout"] == 30.0
    assert SOLVER_KEYS["collective_timeout"].default == 600.0
