"""An exclusive lock on a file, shared by the processes of a machine: the engine cache's writes and numba's compiles
(kernels/compile_lock.py) take one."""
import contextlib
import fcntl
import os
import time


@contextlib.contextmanager
def locked_file(path, wait, polled=None):
    """An exclusive flock of ``path`` (made, with its folder, if need be) for the block, which is told True; or
    False after ``wait`` seconds of another process holding it. A folder that takes no lock file, or a file system
    without flock: True, unlocked. ``polled()``, if given, is called between two tries."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path, "a")
    except OSError:
        yield True
        return
    with handle:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                if polled is not None:
                    polled()
                time.sleep(0.01)
            except OSError:  # a file system without flock
                yield True
                return
        yield True
