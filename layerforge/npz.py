"""Arrays to and from ``.npz`` files: written atomically (as every weights file is), read without pickle."""
import os
import tempfile
import zipfile

import numpy

from .errors import LayerforgeError


def write_atomic(path, write):
    """Create ``path`` by ``write(binary file)`` so that a reader sees the old file or the new one, never half of one.

    The data goes to a temporary file in the same directory, is fsync'ed, then renamed over ``path``.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    except OSError as e:
        raise LayerforgeError(f"{path}: cannot write here: {e.strerror} ({e.filename})") from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; the file gets what open() would give, as Caffe's do
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):  # a full or read-only disk: the file that was there is untouched
            raise LayerforgeError(f"{path}: cannot write: {e.strerror or e}; any earlier file at this path is "
                                  f"intact") from None
        raise


def _umask():
    """The process's umask, read from /proc where it can be (setting it to read it back would race other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_writable(folder, what):
    """Raise a one-line LayerforgeError naming ``what`` unless files can be created in ``folder`` (made if needed)."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise LayerforgeError(f"{what}: cannot write files in {folder}: {e.strerror}") from None


def save_npz_atomic(path, arrays):
    """Write ``{name: array}`` to ``path`` atomically (:func:`write_atomic`)."""
    write_atomic(path, lambda f: numpy.savez(f, **arrays))


def load_npz(path):
    """Read every array of an ``.npz`` file into a dict (allow_pickle=False); bad files raise LayerforgeError."""
    path = os.fspath(path)
    try:
        loaded = numpy.load(path, allow_pickle=False)
        if not isinstance(loaded, numpy.lib.npyio.NpzFile):  # a single .npy array has no names to match
            raise LayerforgeError(f"{path}: a single array ({loaded.shape}), not an .npz of named arrays "
                                  f"(weights come as .npz from net.save, or .caffemodel)")
        with loaded as f:
            return {k: f[k] for k in f.files}
    except FileNotFoundError:
        raise LayerforgeError(f"{path}: no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise LayerforgeError(f"{path}: not a readable .npz file ({e})") from None
