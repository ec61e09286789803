"""What a process of an MPI job tells its launcher without MPI: that it has been heard, and how the job ends; and the
shared memory the job must not leave behind.

MPICH's hydra reports a job's exit status as the bitwise OR of its ranks' wait statuses (mpiexec.c's
``get_exit_status``), so a job whose ranks end differently (one exits 124, another is killed by signal 9 as
hydra tears the job down) gets a status that depends on which rank hydra reaped first. One way is exact:
a rank's PMI ``abort`` makes mpiexec exit at once with the rank's code (``HYD_pmiserv_abort``), whatever becomes
of the others. ``MPI_Abort`` on COMM_WORLD sends it (comm/guard.py); a rank's supervisor, which never starts MPI,
sends it itself (:func:`end_job`) when its child was killed.

However a job ends, it must not leave memory behind. MPICH's ranks on one host talk through one file,
``/dev/shm/mpich_shm_<job>_<host>`` (a few MB; a process started without mpiexec maps one of its own,
``mpich_shm_<pid>_0``), opened by name in MPI_Init and unlinked only in MPI_Finalize: every job ended by MPI_Abort,
a kill or a deadline, and every process that ended in ``os._exit``, kept its file (7,825 of them, 9 GB of memory,
after a day of tests here), and no MPICH setting removes it earlier. So a process removes the name as soon as MPI has
started (:func:`release_segment_names`, when layerforge.comm is imported, which starts MPI): the ranks keep their
mapping, and the memory goes back to the system when the last of them ends, however it ends.
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


SEGMENTS = "/dev/shm/mpich_shm_"  # MPICH's intranode transport (ch4 posix): one file per job and host


def mapped_segments(maps="/proc/self/maps"):
    """``{path: (device, inode)}`` of MPICH's shared-memory files this process maps, their names removed or not;
    empty where there is no /proc."""
    found = {}
    try:
        with open(maps) as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split(None, 5)  # address perms offset major:minor inode path
        if len(fields) == 6 and fields[5].startswith(SEGMENTS):
            major, minor = (int(x, 16) for x in fields[3].split(":"))
            found[fields[5].removesuffix(" (deleted)")] = (os.makedev(major, minor), int(fields[4]))
    return found


def release_segment_names():
    """Remove the names of the MPICH shared-memory files this process maps, so that their memory goes back to the
    system however the job ends; returns the paths removed here (another rank of the host may have been first).

    Safe once MPI_Init has returned: MPICH opens the file by name (``MPL_initshm_open``) only while it sets up
    COMM_WORLD in MPI_Init, which returns once every rank of the host has mapped it; MPI_Finalize's own unlink then
    finds the name gone, which it ignores. A name is removed only while it is still the very file mapped here
    (same device and inode), never another job's file that took the name since."""
    removed = []
    for path, (device, inode) in mapped_segments().items():
        try:
            seen = os.stat(path)
            if (seen.st_dev, seen.st_ino) == (device, inode):
                os.unlink(path)
                removed.append(path)
        except OSError:  # removed already, by another rank of this host
            continue
    return removed
