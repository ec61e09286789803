"""LMDB databases of labelled images: the record formats, a writer and a reader.

A database is an LMDB directory (``data.mdb`` + ``lock.mdb``). Keys are zero-padded record indices
(``b"00000000"``, ``b"00000001"``, ...) so that key order is index order; the reader accepts any keys
and reads them in sorted order. Every value is one record, in one of two formats; the reader tells them
apart per database by its first record:

* Caffe's ``Datum`` (a serialized protobuf message, layerforge/data/datum.py), as Caffe's
  convert_imageset writes and as ours does by default;
* layerforge's own "LFR1" format::

    offset  size  field
    0       4     magic b"LFR1"
    4       1     kind: 0 = raw uint8, 1 = raw float32, 2 = encoded image (PNG/JPEG file bytes)
    5       3     reserved, zero
    8       4     channels C  (uint32)
    12      4     height H    (uint32)
    16      4     width W     (uint32)
    20      4     label       (int32)
    24      ...   payload: raw values in C, H, W order (channel-major, as Caffe's Datum), or the encoded file

All integers are little-endian; colour images are BGR (OpenCV's order, as in Caffe). docs/data.md
has the same description.
"""
import os
import shutil
import struct
import tempfile
import threading
import weakref

import lmdb
import numpy

from .datum import decode_datum
from ..errors import DataError

MAGIC = b"LFR1"
HEADER = struct.Struct("<4sB3xIIIi")
RAW_UINT8, RAW_FLOAT32, ENCODED = 0, 1, 2
_RAW_DTYPES = {RAW_UINT8: numpy.dtype(numpy.uint8), RAW_FLOAT32: numpy.dtype("<f4")}


def record_key(index):
    """The key of record ``index``: its zero-padded decimal digits."""
    return b"%08d" % index


def encode_record(array, label):
    """A record holding ``array`` (C, H, W) of uint8 or float32 and an integer ``label``."""
    array = numpy.asarray(array)
    if array.ndim != 3:
        raise ValueError(f"a record holds a (C, H, W) array, got shape {array.shape}")
    if array.dtype == numpy.uint8:
        kind = RAW_UINT8
    elif array.dtype in (numpy.float32, numpy.float64):
        kind = RAW_FLOAT32
    else:
        raise ValueError(f"records hold uint8 or float32 values, not {array.dtype}")
    payload = numpy.ascontiguousarray(array, dtype=_RAW_DTYPES[kind]).tobytes()
    return HEADER.pack(MAGIC, kind, *array.shape, int(label)) + payload


def encode_image_record(data, shape, label):
    """A record holding an encoded image file (PNG/JPEG bytes) that decodes to ``shape`` (C, H, W)."""
    return HEADER.pack(MAGIC, ENCODED, *shape, int(label)) + bytes(data)


def decode_record(value, source="<record>", key=b"?"):
    """``(array, label)`` from a record: array (C, H, W) uint8 or float32.

    Raises DataError naming ``source`` and ``key`` when the record is corrupted.
    """
    def fail(why):
        k = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        return DataError(f"{source}: key '{k}': corrupted record: {why}")

    value = bytes(value)
    if len(value) < HEADER.size:
        raise fail(f"{len(value)} bytes is shorter than the {HEADER.size}-byte header")
    magic, kind, c, h, w, label = HEADER.unpack_from(value)
    if magic != MAGIC:
        raise fail(f"bad magic {magic!r} (expected {MAGIC!r})")
    payload = memoryview(value)[HEADER.size:]
    if 0 in (c, h, w):
        raise fail(f"its shape {c}x{h}x{w} holds no values")
    if kind in _RAW_DTYPES:
        dtype = _RAW_DTYPES[kind]
        if len(payload) != c * h * w * dtype.itemsize:
            raise fail(f"payload of {len(payload)} bytes does not hold {c}x{h}x{w} {dtype.name} values")
        array = numpy.frombuffer(payload, dtype=dtype).reshape(c, h, w)
        return (array if dtype == numpy.uint8 else array.astype(numpy.float32)), label
    if kind == ENCODED:
        from .images import decode_image  # OpenCV's and libjpeg's own messages are caught there

        where = f"{source}: key '{bytes(key).decode('utf-8', 'replace')}'"
        array = decode_image(numpy.frombuffer(payload, numpy.uint8), c != 1, where)
        if array is None:
            raise fail("the encoded image cannot be decoded")
        if array.shape != (c, h, w):
            raise fail(f"decoded image is {array.shape}, the header says {(c, h, w)}")
        return array, label
    raise fail(f"unknown record kind {kind}")


def lmdb_exists(path):
    return os.path.isfile(os.path.join(path, "data.mdb"))


# py-lmdb refuses to open one environment twice in a process, and a train and a test net (or two
# layers) may read the same database: readers share one read-only environment per database file.
_ENVIRONMENTS = weakref.WeakValueDictionary()
_ENVIRONMENTS_LOCK = threading.Lock()


def _open_readonly(path):
    st = os.stat(os.path.join(path, "data.mdb"))
    key = (os.path.realpath(path), st.st_dev, st.st_ino)
    with _ENVIRONMENTS_LOCK:
        env = _ENVIRONMENTS.get(key)
        if env is None:
            env = lmdb.open(path, readonly=True, lock=False, readahead=False, max_readers=64)
            # a truncated data.mdb is mapped whole: reading a page past its end kills the process with SIGBUS
            needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
            if st.st_size < needed:
                env.close()
                raise DataError(f"{path}: the LMDB database is truncated: data.mdb has {st.st_size:,} bytes but its "
                                f"pages reach {needed:,} (an interrupted copy?)")
            _ENVIRONMENTS[key] = env
        return env


class LMDBReader:
    """Random access to a database's records by position in sorted key order.

    ``len(reader)``, ``reader.keys[i]``, ``reader.read(i)`` -> (array, label),
    ``reader.read_many(indices)`` (one read transaction), ``reader.name_of(i)`` for messages,
    ``reader.format`` ("Datum" or "LFR1", from the first record). ``decode(value, path, key)`` replaces the
    format's decoder (AnnotatedDatum records: layerforge/data/annotations.py). Safe to use from one thread at a
    time.
    """

    def __init__(self, path, decode=None):
        self.path = str(path)
        if not lmdb_exists(self.path):
            raise DataError(f"{self.path}: no LMDB database there (no data.mdb)")
        try:
            self.env = _open_readonly(self.path)
            with self.env.begin() as txn:
                self.keys = list(txn.cursor().iternext(keys=True, values=False))
        except lmdb.Error as e:
            raise DataError(f"{self.path}: cannot open LMDB database: {e}") from None
        if not self.keys:
            raise DataError(f"{self.path}: the LMDB database is empty")
        with self.env.begin() as txn:
            first = txn.get(self.keys[0]) or b""
        self.format = "LFR1" if first[:len(MAGIC)] == MAGIC else "Datum"
        self._decode = decode or (decode_record if self.format == "LFR1" else decode_datum)

    def __len__(self):
        return len(self.keys)

    def name_of(self, index):
        return f"{self.path}: key '{self.keys[index].decode('utf-8', 'replace')}'"

    def read(self, index):
        return self.read_many([index])[0]

    def reopen(self):
        """Open the database afresh in a process forked from the one that opened it: an LMDB environment serves
        only the process that opened it (and py-lmdb refuses a second one while the inherited one is open), so
        this process's inherited copy is closed first; the parent's stays open."""
        self.env.close()
        self.env = lmdb.open(self.path, readonly=True, lock=False, readahead=False)

    def read_many(self, indices):
        out = []
        with self.env.begin(buffers=True) as txn:
            for i in indices:
                key = self.keys[i]
                value = txn.get(key)
                if value is None:
                    raise DataError(f"{self.path}: key '{key.decode('utf-8', 'replace')}': record is missing")
                out.append(self._decode(value, self.path, key))
        return out


class LMDBWriter:
    """Appends records under keys ``record_key(0)``, ``record_key(1)``, ...; the map grows as needed.

    Use as a context manager; records are committed every ``commit_every`` puts and at exit.
    """

    def __init__(self, path, commit_every=1000, map_size=64 << 20):
        self.path = str(path)
        os.makedirs(self.path, exist_ok=True)
        self.env = lmdb.open(self.path, map_size=map_size, subdir=True)
        self.count, self.commit_every, self._pending = 0, commit_every, []

    def put(self, value, key=None):
        """Store an encoded record (``encode_record`` / ``encode_image_record``) under ``key`` (bytes; default
        the next index's key)."""
        self._pending.append((record_key(self.count) if key is None else key, value))
        self.count += 1
        if len(self._pending) >= self.commit_every:
            self.commit()

    def add(self, array, label):
        self.put(encode_record(array, label))

    def commit(self):
        while self._pending:
            try:
                with self.env.begin(write=True) as txn:
                    for key, value in self._pending:
                        txn.put(key, value)
                self._pending = []
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def close(self):
        self.commit()
        self.env.sync()
        self.env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:
            self.env.close()


def write_lmdb_atomic(path, records, exist_ok=False):
    """Write ``records`` (an iterable of encoded records, or of ``(key, record)`` pairs) to a new database at
    ``path``.

    The database is built in a temporary directory beside ``path`` and renamed into place, so ``path``
    either does not exist or is complete. With ``exist_ok`` an existing ``path`` (e.g. written by a
    concurrent process) is kept and this call's copy discarded. Returns the number of records.
    """
    path = os.path.abspath(str(path))
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", dir=parent)
    try:
        with LMDBWriter(tmp) as writer:
            for value in records:
                writer.put(*(value[::-1] if isinstance(value, tuple) else (value,)))
        count = writer.count
        try:
            os.rename(tmp, path)
        except OSError:
            if not (exist_ok and lmdb_exists(path)):
                raise DataError(f"{path}: already exists; remove it first") from None
        return count
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
