"""Rank supervision: under ``mpiexec``, a rank's work runs in a child process that its parent watches.

A rank killed without a word (SIGKILL, the kernel's out-of-memory killer, a segfault) cannot report its
own death, and MPICH's hydra then prints only "BAD TERMINATION ... EXIT CODE: 9" with a pid, and kills
the other ranks at once. So the process hydra starts (the supervisor) runs the same command as a child
and waits for it: when the child dies by a signal, the supervisor prints ``rank R (host H, pid P): killed
by signal S`` and exits non-zero, and hydra ends the job. The child inherits the PMI connection (MPI
starts in the child, never in the supervisor) and dies with its supervisor (PR_SET_PDEATHSIG), so
killing either ends the rank. Signals the supervisor gets (Ctrl-C, SIGTERM, SIGHUP) go on to the child.
"""
import ctypes
import os
import signal
import socket
import subprocess
import sys

SUPERVISED = "LAYERFORGE_SUPERVISED"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def mpi_rank_from_env():
    """This process's rank as the launcher's environment gives it, or None."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def needs_supervisor():
    """True in a process that mpiexec started for a job of several ranks and that is not a child already."""
    from .mpi import mpi_world_size

    return mpi_world_size() > 1 and os.environ.get(SUPERVISED) != "1"


def _die_with_parent():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the kernel kills the child when its parent dies
    except (OSError, AttributeError):  # not Linux: the supervisor forwards what it can
        pass


def supervise(argv):
    """Run ``python -m layerforge argv...`` as this rank's child; returns the exit status for this process."""
    env = dict(os.environ, **{SUPERVISED: "1"})
    child = subprocess.Popen([sys.executable, "-m", "layerforge", *argv], env=env, close_fds=False,
                             preexec_fn=_die_with_parent)  # close_fds=False: the PMI descriptor must reach it

    def forward(signum, frame):
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for s in FORWARDED:
        signal.signal(s, forward)
    status = child.wait()
    if status >= 0:
        return status
    signum = -status
    name = signal.Signals(signum).name
    why = " (also what the kernel's out-of-memory killer sends)" if signum == signal.SIGKILL else ""
    print(f"rank {mpi_rank_from_env()} (host {socket.gethostname()}, pid {child.pid}): killed by signal "
          f"{signum} ({name}){why}", file=sys.stderr, flush=True)
    return 128 + signum
