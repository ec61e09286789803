"""The topology files MPICH's process manager leaves in /tmp when a test kills it.

Each ``hydra_pmi_proxy`` writes the node's hwloc topology to ``/tmp/hydra_hwloc_xmlfile_XXXXXX`` (that folder
whatever TMPDIR says), holds it open while its ranks run and removes it when it exits; a proxy that a test ends
with SIGKILL (a stalled or killed job's clean-up) cannot. The session removes the files that appeared during the
run and that no process holds open any more, so a concurrent job's file is never touched."""
import glob
import os

FOLDER = "/tmp"
PATTERN = "hydra_hwloc_xmlfile_*"


def present(folder=FOLDER):
    """The paths of the topology files in ``folder`` now."""
    return set(glob.glob(os.path.join(folder, PATTERN)))


def held_open(pids=None):
    """The paths some process this user may read holds open (Linux: /proc/*/fd); ``pids``: those processes only."""
    held = set()
    for fd_dir in glob.glob("/proc/[0-9]*/fd") if pids is None else [f"/proc/{pid}/fd" for pid in pids]:
        try:
            names = os.listdir(fd_dir)
        except OSError:  # the process ended, or is another user's
            continue
        for name in names:
            try:
                held.add(os.readlink(os.path.join(fd_dir, name)))
            except OSError:
                continue
    return held


def remove_orphans(before, folder=FOLDER):
    """Remove the topology files in ``folder`` absent from ``before`` that no process holds open; returns them."""
    orphans = sorted((present(folder) - set(before)) - held_open())
    for path in orphans:
        try:
            os.remove(path)
        except OSError:
            pass
    return orphans
