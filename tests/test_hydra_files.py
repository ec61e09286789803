"""tests/hydra_files.py: the session removes the topology files of the MPI jobs the tests killed, and only those."""
import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import hydra_files


def test_only_new_files_no_process_holds_open_are_removed(tmp_path):
    old, held, orphan = (tmp_path / f"hydra_hwloc_xmlfile_{k}" for k in ("old", "held", "orphan"))
    old.write_text("x")
    before = hydra_files.present(str(tmp_path))
    held.write_text("x")
    orphan.write_text("x")
    (tmp_path / "other_file").write_text("x")
    with open(held) as still_open:  # as a running job's proxy holds its file
        assert hydra_files.remove_orphans(before, str(tmp_path)) == [str(orphan)]
        assert not still_open.closed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hydra_hwloc_xmlfile_held", "hydra_hwloc_xmlfile_old",
                                                         "other_file"]


def _held_by_job(pid):
    """The topology files that process ``pid`` and its descendants hold open (hydra's proxy is mpiexec's child, in a
    session of its own): one job's files, whatever other jobs (another xdist worker's) run beside it."""
    parents = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                parents[int(stat.split("/")[2])] = int(f.read().rsplit(")", 1)[1].split()[1])  # state, ppid, ...
        except OSError:  # the process ended
            continue
    job, grown = {pid}, True
    while grown:
        children = {p for p, parent in parents.items() if parent in job} - job
        job, grown = job | children, bool(children)
    return hydra_files.held_open(job) & hydra_files.present()


@pytest.mark.mpi
def test_the_file_of_a_killed_job_is_left_by_hydra_and_removed_here():
    before = hydra_files.present()
    job = subprocess.Popen(["mpiexec", "-n", "1", sys.executable, "-c",
                            "from mpi4py import MPI; import time; time.sleep(60)"],
                           start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, made = time.monotonic() + 30, set()
        while not made and time.monotonic() < deadline:
            time.sleep(0.05)
            made = _held_by_job(job.pid) - before
        assert made, "mpiexec's proxy holds no topology file in /tmp"
        assert not made & set(hydra_files.remove_orphans(before))  # held open while the job runs: kept
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # as a test's clean-up ends a stalled job: the proxy cannot remove it
        job.wait()
    deadline = time.monotonic() + 30  # the orphaned proxy exits on its own (later on a busy machine)
    while made & hydra_files.held_open() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert made <= hydra_files.present(), "hydra removed it itself"
    assert set(hydra_files.remove_orphans(before)) >= made
    assert not (hydra_files.present() & made)
