"""What a process of an MPI job tells its launcher without MPI: that it has been heard, and how the job ends.

MPICH's hydra reports a job's exit status as the bitwise OR of its ranks' wait statuses (mpiexec.c's
``get_exit_status``), so a job whose ranks end differently (one exits 124, another is killed by signal 9 as
hydra tears the job down) gets a status that depends on which rank hydra reaped first. One way is exact:
a rank's PMI ``abort`` makes mpiexec exit at once with the rank's code (``HYD_pmiserv_abort``), whatever becomes
of the others. ``MPI_Abort`` on COMM_WORLD sends it (comm/guard.py); a rank's supervisor, which never starts MPI,
sends it itself (:func:`end_job`) when its child was killed.
"""
import array
import os
import stat
import time

PMI_FD = "PMI_FD"  # the descriptor hydra gives each process it starts for PMI (inherited by a supervisor's child)


def read_by_the_launcher(stream, timeout=2.0):
    """Wait (up to ``timeout`` s) until the reader of ``stream``, a pipe to the launcher, has taken what was written:
    hydra forwards nothing more of a rank once it ends the job, and it ends it on MPI_Abort (the rank's line was lost
    about one time in ten here). A pipe's unread bytes are what FIONREAD reports on either end."""
    try:
        import fcntl
        import termios

        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        unread, deadline = array.array("i", [0]), time.monotonic() + timeout
        while time.monotonic() < deadline:
            fcntl.ioctl(fd, termios.FIONREAD, unread, True)
            if unread[0] == 0:
                return
            time.sleep(0.005)
    except (ImportError, OSError, ValueError, AttributeError):  # not a file descriptor, or no FIONREAD here
        return


def end_job(code):
    """Have hydra end the whole job now with exit status ``code``, as ``MPI_Abort`` would, from a process that never
    started MPI (a rank's supervisor): the PMI-1 ``abort`` command on the descriptor hydra gave it. True when sent;
    False under another launcher (no ``PMI_FD``), where the caller's own exit status has to do."""
    fd = os.environ.get(PMI_FD, "")
    if not fd.isdigit():
        return False
    try:
        os.write(int(fd), f"cmd=abort exitcode={int(code)}\n".encode())
    except OSError:  # the launcher is gone already
        return False
    return True
