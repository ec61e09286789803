"""tests/hydra_files.py: the session removes the topology files of the MPI jobs the tests killed, and only those."""
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


@pytest.mark.mpi
def test_the_file_of_a_killed_job_is_left_by_hydra_and_removed_here():
    before = hydra_files.present()
    job = subprocess.Popen(["mpiexec", "-n", "1", sys.executable, "-c",
                            "from mpi4py import MPI; import time; time.sleep(60)"],
                           start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not hydra_files.present() - before and time.monotonic() < deadline:
            time.sleep(0.05)
        made = hydra_files.present() - before
        assert made, "mpiexec's proxy wrote no topology file in /tmp"
        assert not hydra_files.remove_orphans(before)  # held open while the job runs: kept
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # as a test's clean-up ends a stalled job: the proxy cannot remove it
        job.wait()
    time.sleep(0.2)
    left = hydra_files.present() - before
    assert left & made, "hydra removed it itself"
    assert set(hydra_files.remove_orphans(before)) >= made & left
    assert not (hydra_files.present() & made)
