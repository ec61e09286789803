"""Signals to a data-parallel job under mpiexec end in a snapshot, agreed by every rank, with a CPU hog beside.

A rank is three processes: its supervisor (what hydra started), the training child, and the child's decode worker;
each carries the rank's PMI_RANK, and a signal may reach any of them. hydra passes a Ctrl-C (or a SIGTERM) it
gets to every rank's process group.
"""
import os
import signal

import pytest

from layerforge.npz import load_npz

from .mpijob import Job, cpu_hog, snapshots, train, under_mpiexec, write_solver  # noqa: F401 - cpu_hog: a fixture

pytestmark = pytest.mark.mpi


def stopped_cleanly(job, code, tmp_path):
    """The job ended as a requested stop does: exit 0, one "stopped early", no traceback; returns the snapshots."""
    assert code == 0, job.log[-3000:]
    assert job.log.count("Optimization stopped early.") == 1, job.log[-3000:]
    assert "Traceback" not in job.log and "KeyboardInterrupt" not in job.log, job.log[-3000:]
    return snapshots(tmp_path)


@pytest.mark.parametrize("which", ["supervisor", "child", "worker"])
def test_sigterm_to_any_process_of_one_rank_stops_every_rank_with_a_snapshot(tmp_path, cpu_hog, which):
    with Job(under_mpiexec(3, train(write_solver(tmp_path)))) as job:
        job.wait_for(r"Iteration 3 \(")
        os.kill(job.process(1, which), signal.SIGTERM)
        code = job.finish()
    assert len(stopped_cleanly(job, code, tmp_path)) == 1


@pytest.mark.parametrize("which", ["supervisor", "worker"])
def test_sighup_to_one_process_of_one_rank_snapshots_and_training_goes_on(tmp_path, cpu_hog, which):
    with Job(under_mpiexec(3, train(write_solver(tmp_path)))) as job:
        job.wait_for(r"Iteration 3 \(")
        os.kill(job.process(2, which), signal.SIGHUP)
        first = int(job.wait_for(r"Snapshotting to \S+_iter_(\d+)\.npz")[1])
        job.wait_for(rf"Iteration {first + 2} \(")
        job.signal(signal.SIGTERM)  # to mpiexec, which passes it to every rank
        code = job.finish()
    taken = stopped_cleanly(job, code, tmp_path)
    assert taken[0] == first and len(taken) == 2 and taken[1] >= first + 2


def test_a_copy_of_the_signal_that_comes_after_the_stop_does_not_kill_the_rank(tmp_path):
    """On a loaded machine one rank's supervisor may pass mpiexec's SIGTERM on after the other ranks' copies have
    stopped the job (CI saw it): that rank stops with them, and the late copy must not kill it as it finishes."""
    with Job(under_mpiexec(3, train(write_solver(tmp_path)))) as job:
        job.wait_for(r"Iteration 3 \(")
        late = job.process(2, "supervisor")
        os.kill(late, signal.SIGSTOP)  # holds rank 2's copy back
        try:
            job.signal(signal.SIGTERM)
            job.wait_for(r"Snapshotting to")
        finally:
            os.kill(late, signal.SIGCONT)
        code = job.finish()
    assert "killed by signal" not in job.log, job.log[-3000:]
    assert len(stopped_cleanly(job, code, tmp_path)) == 1


@pytest.mark.parametrize("when", ["start-up", "trial", "training"])
def test_ctrl_c_to_mpiexec_stops_every_rank_with_a_snapshot(tmp_path, cpu_hog, when):
    """Ctrl-C reaches each rank twice (hydra signals the rank's process group; the supervisor passes on what it
    gets): one request. At start-up (imports, MPI_Init, building the nets) it waits for the first iteration; during
    AUTO's timing of the convolution engines and during training it is carried out after the iteration that runs."""
    # a heavier convolution after start-up: AUTO's timing takes a while, and an iteration is long enough for both
    # of a Ctrl-C's deliveries to come within it; a rate at which it learns (at 0.01 the 67,712 inputs of ip made the
    # loss NaN at iteration 41, before a Ctrl-C late on a loaded machine)
    keys = {} if when == "start-up" else {"conv_output": 32, "shape": (16, 48, 48), "base_lr": 1e-5}
    with Job(under_mpiexec(2, train(write_solver(tmp_path, **keys)))) as job:
        if when == "start-up":
            for rank in (0, 1):
                job.process(rank, "child")
        elif when == "trial":
            job.wait_for(r"Solving net")
        else:
            job.wait_for(r"forward engine")
            job.wait_for(r"Iteration 3 \(")
        job.signal(signal.SIGINT)
        code = job.finish()
    taken = stopped_cleanly(job, code, tmp_path)
    assert len(taken) == 1
    conv = load_npz(tmp_path / "snap" / f"net_iter_{taken[0]}.solverstate.npz")["data_state"].item()
    if when == "start-up":
        assert taken == [1]
    elif when == "trial":  # AUTO settles the engines before the first iteration: the snapshot holds the choice
        assert '"choice": {"forward": "' in conv and '"timing": {}' in conv, conv
    else:
        assert taken[0] >= 3
