"""Rank supervision: under ``mpiexec``, a rank's work runs in a child process that its parent watches.

A rank killed without a word (SIGKILL, the kernel's out-of-memory killer, a segfault) cannot report its
own death, and MPICH's hydra then prints only "BAD TERMINATION ... EXIT CODE: 9" with a pid, and kills
the other ranks at once. So the process hydra starts (the supervisor) runs the same command as a child
and waits for it: when the child dies by a signal, the supervisor prints ``rank R (host H, pid P): killed
by signal S`` and has hydra end the job with exit status 128 + S, every time (a PMI abort: launcher.py). The child inherits the PMI connection (MPI
starts in the child, never in the supervisor) and dies with its supervisor (PR_SET_PDEATHSIG), so
killing either ends the rank.

Signals the supervisor gets (Ctrl-C, SIGTERM, SIGHUP, SIGUSR1/2) go on to the child, exactly once: hydra
signals a rank's whole process group (its Ctrl-C, and the SIGTERM mpiexec gets), so the child leads a
process group of its own, which only the supervisor's forwarding reaches. A signal that comes before the
supervisor has started the child is forwarded once it has. ``train``'s child starts with SIGINT, SIGTERM and
SIGHUP held (blocked, across exec) and lets them in once it records them as requests (dataparallel/runners.py, process_guard):
a Ctrl-C during its start-up (imports, MPI_Init, building the nets) is carried out at the first iteration,
as one during training is, instead of raising wherever the child happens to be.

A rank that dies before its MPI_Init has finished is not enough for hydra, which then keeps the job waiting
(the other ranks spin in MPI_Init) forever. So a supervisor whose child died leaves a watchdog behind: if
this node's launcher proxy (hydra_pmi_proxy) still runs after ``END_JOB_GRACE`` seconds, the watchdog ends
the proxy's other ranks (SIGTERM, which their supervisors pass on and report, then SIGKILL), and hydra
ends the job once they are gone. When hydra ends the job itself, as it does for a rank that dies later,
the proxy is gone by then and the watchdog does nothing.
"""
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

from ..launcher import end_job, read_by_the_launcher

SUPERVISED = "LAYERFORGE_SUPERVISED"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what train's child holds until it records requests
END_JOB_GRACE = 5.0  # seconds hydra gets to end the job itself; tearing down a loaded 4-rank job takes ~1 s
PROXIES = (b"hydra_pmi_proxy",)  # the launcher processes that start ranks (MPICH's hydra)


def mpi_rank_from_env():
    """This process's rank as the launcher's environment gives it, or None."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def needs_supervisor():
    """True in a process that mpiexec started for a job of several ranks and that is not a child already."""
    from ..cores import mpi_world_size

    return mpi_world_size() > 1 and os.environ.get(SUPERVISED) != "1"


def _die_with_parent():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the kernel kills the child when its parent dies
    except (OSError, AttributeError):  # not Linux: the supervisor forwards what it can
        pass


def hold_signals():
    """Block SIGINT, SIGTERM and SIGHUP in this thread (and in what it starts: threads, and processes across
    exec) until :func:`release_held_signals`: one that comes meanwhile waits in the kernel, instead of striking
    a process that has not yet put its handlers in place."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)


def release_held_signals():
    """Unblock what :func:`hold_signals` blocked (here, or in the supervisor before exec); what waited is
    delivered now, to the handlers in place."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def child_preexec(hold=False):
    """``preexec_fn`` of a child that dies with its parent and leads a process group of its own, so that a signal
    sent to the parent's group reaches the child only as the parent passes it on; ``hold``: the child starts with
    the signals held (:func:`hold_signals`)."""
    _die_with_parent()
    os.setpgid(0, 0)
    if hold:
        hold_signals()


def supervise(argv):
    """Run ``python -m layerforge argv...`` as this rank's child; returns the exit status for this process."""
    env = dict(os.environ, **{SUPERVISED: "1"})
    child, early = None, []

    def forward(signum, frame):
        if child is None:
            early.append(signum)  # the child is being started: it gets this once it exists
            return
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for s in FORWARDED:
        signal.signal(s, forward)
    hold = argv[:1] == ["train"]
    child = subprocess.Popen([sys.executable, "-m", "layerforge", *argv], env=env, close_fds=False,
                             preexec_fn=lambda: child_preexec(hold))  # close_fds=False: the PMI descriptor must reach it
    for signum in early:
        forward(signum, None)
    status = child.wait()
    if status >= 0:
        return status
    signum = -status
    name = signal.Signals(signum).name
    why = " (also what the kernel's out-of-memory killer sends)" if signum == signal.SIGKILL else ""
    print(f"rank {mpi_rank_from_env()} (host {socket.gethostname()}, pid {child.pid}): killed by signal "
          f"{signum} ({name}){why}", file=sys.stderr, flush=True)
    # hydra's own status would be whichever rank it reaped first, this one's or a kill it sent (launcher.py)
    read_by_the_launcher(sys.stderr)
    end_job(128 + signum)
    _leave_watchdog(os.getppid())
    return 128 + signum


def _process_start(pid):
    """``(command line, start time in clock ticks)`` of process ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    return cmdline, start


def _leave_watchdog(proxy):
    """Start :func:`end_job_if_stuck` for launcher process ``proxy`` in a detached process of its own."""
    seen = _process_start(proxy)
    if seen is None or not any(name in seen[0] for name in PROXIES):
        return  # not started by a launcher we know how to stop
    subprocess.Popen([sys.executable, "-c", "import sys; from layerforge.dataparallel.supervisor import "
                      f"end_job_if_stuck; end_job_if_stuck({proxy}, {seen[1]}, {END_JOB_GRACE})"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     close_fds=True, start_new_session=True)  # holds none of the rank's pipes or PMI socket


def _children(pid):
    """The pids of the processes whose parent is ``pid``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def end_job_if_stuck(proxy, start, grace):
    """End the ranks that launcher process ``proxy`` (started at ``start`` ticks) still runs after ``grace``
    seconds: SIGTERM, then SIGKILL 2 s later. Comparing the start time makes a recycled pid safe."""

    def ranks_left():
        seen = _process_start(proxy)
        return _children(proxy) if seen is not None and seen[1] == start else []

    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        seen = _process_start(proxy)
        if seen is None or seen[1] != start:
            return  # hydra ended the job itself
        time.sleep(0.1)
    for signum, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.0)):
        for rank in ranks_left():
            _signal(rank, signum)
        deadline = time.monotonic() + wait
        while ranks_left() and time.monotonic() < deadline:
            time.sleep(0.1)


def _signal(pid, signum):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
