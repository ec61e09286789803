"""Arrays to and from ``.npz`` files: written atomically (as every weights file is), read without pickle."""
import collections.abc
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
    """The arrays of an ``.npz`` file as a read-only mapping (:class:`NpzArrays`), each array read when it is looked up
    (allow_pickle=False); bad files raise LayerforgeError."""
    return NpzArrays(path)


def shape_of(arrays, key):
    """The shape of ``arrays[key]``, read from its header alone where ``arrays`` is an :class:`NpzArrays`."""
    return arrays.shape(key) if isinstance(arrays, NpzArrays) else tuple(numpy.shape(arrays[key]))


MAGIC = b"\x93NUMPY"
_READ_BLOCK = 1 << 24  # bytes of an array decompressed at a time, straight into the array


class NpzArrays(collections.abc.Mapping):
    """The arrays of an ``.npz`` file, read lazily: only an array that is looked up is decompressed, after its
    ``.npy`` header (shape, dtype) has been read and checked against the size the zip's directory gives it, so
    that a small file cannot make a reader allocate or decompress more than what it declares (a weights file with
    a large array the net does not use costs nothing; a header claiming 10^12 elements is refused in one line).
    A caller that knows the shape it needs asks :meth:`shape` (the header alone) before it reads the array."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._headers = {}  # name -> (shape, fortran_order, dtype, offset of the data in the member)
        try:
            with open(self.path, "rb") as f:
                if f.read(len(MAGIC)) == MAGIC:  # a single array has no names to match
                    f.seek(0)
                    shape = _header(f, self.path)[0]
                    raise LayerforgeError(f"{self.path}: a single array ({shape}), not an .npz of named arrays "
                                          f"(weights come as .npz from net.save, or .caffemodel)")
            with zipfile.ZipFile(self.path) as z:
                self._members = {info.filename[:-4]: info for info in z.infolist() if info.filename.endswith(".npy")}
        except FileNotFoundError:
            raise LayerforgeError(f"{self.path}: no such file") from None
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
            raise LayerforgeError(f"{self.path}: not a readable .npz file ({e})") from None

    def __getitem__(self, key):
        shape, fortran, dtype, offset = self._header(key)
        info = self._members[key]
        try:
            with zipfile.ZipFile(self.path) as z, z.open(info) as f:
                f.read(offset)
                a = numpy.empty(shape, dtype, order="F" if fortran else "C")
                flat = memoryview(a.reshape(-1, order="A").view(numpy.uint8)) if a.size else memoryview(b"")
                done = 0
                while done < a.nbytes:
                    chunk = f.read(min(_READ_BLOCK, a.nbytes - done))
                    if not chunk:
                        raise EOFError("the entry ends before its data")
                    flat[done:done + len(chunk)] = chunk
                    done += len(chunk)
                return a
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
            raise LayerforgeError(f"{self.path}: entry '{key}' is not readable ({e})") from None

    def shape(self, key):
        """The shape of entry ``key``, from its header (KeyError when there is none)."""
        return self._header(key)[0]

    def __contains__(self, key):
        return key in self._members

    def __iter__(self):
        return iter(self._members)

    def __len__(self):
        return len(self._members)

    def _header(self, key):
        if key in self._headers:
            return self._headers[key]
        info = self._members[key]
        try:
            with zipfile.ZipFile(self.path) as z, z.open(info) as f:
                shape, fortran, dtype = _header(f, f"{self.path}: entry '{key}'")
                offset = f.tell()
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
            raise LayerforgeError(f"{self.path}: entry '{key}' is not readable ({e})") from None
        from .logs import format_bytes

        count = 1
        for n in shape:
            count *= n
        nbytes = count * dtype.itemsize
        if offset + nbytes != info.file_size:
            raise LayerforgeError(f"{self.path}: entry '{key}': its header declares shape {shape} of {dtype} "
                                  f"({format_bytes(nbytes)}) but the entry holds {format_bytes(info.file_size)}; "
                                  f"the file is damaged or was not written by numpy")
        self._headers[key] = shape, fortran, dtype, offset
        return self._headers[key]


def _header(f, where):
    """``(shape, fortran_order, dtype)`` of the ``.npy`` stream ``f`` at its start; pickled objects are refused."""
    from numpy.lib import format as npy

    try:
        version = npy.read_magic(f)
        read = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"unsupported .npy format version {version}")
        shape, fortran, dtype = read(f)
    except ValueError as e:
        raise LayerforgeError(f"{where}: not a readable .npy header ({str(e).splitlines()[0][:120]})") from None
    if dtype.hasobject:
        raise LayerforgeError(f"{where}: holds Python objects (a pickle), which are never loaded")
    return shape, fortran, dtype
