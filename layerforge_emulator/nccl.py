"""``cupy.cuda.nccl`` on the emulated devices: communicators across the devices of one process (one thread
per device) and across processes (MPI ranks), over local sockets.

As real NCCL, the unique id carries a bootstrap address: :func:`get_unique_id` opens a listening socket on
127.0.0.1 and starts a *hub* thread in the calling process (rank 0's, under MPI); every
``NcclCommunicator(ndev, uid, rank)`` connects to it. A collective is submitted to the given stream like
any device operation (streams.py): when the stream runs it, the rank sends its buffer to the hub and
waits; once every rank has sent its n-th call, the hub checks that the calls agree (collective, count,
type, operation, root: a mismatch is an ``NcclError`` on every rank, where NCCL would hang or corrupt),
computes the result and answers each rank, which writes its receive buffer.

Results: sums, products, maxima and minima in rank order, in the data type (bfloat16 through float32);
``NCCL_AVG`` is the sum divided by the rank count. Real NCCL reduces in its ring or tree order, so float
sums may differ in the last bits. Not emulated: point-to-point ``send``/``recv``, ``commSplit``, and
several communicators of one clique driven by one thread (NCCL's ``groupStart``/``groupEnd`` around the
calls of every device): each rank's collective waits for the others, so each needs a thread or a process
of its own (``groupStart``/``groupEnd`` are accepted around one communicator's calls). A rank that waits
longer than ``LAYERFORGE_EMULATED_NCCL_TIMEOUT`` seconds (default 300) for the others raises instead of
hanging.
"""
import functools
import itertools
import os
import socket
import struct
import threading

import numpy

from . import allocations, streams
from .cublas import round_to_bfloat16
from .device import Device
from .runtime import getDevice

NCCL_UNIQUE_ID_BYTES = 128
MAGIC = b"LFEMUNCCL1"
TIMEOUT_ENV = "LAYERFORGE_EMULATED_NCCL_TIMEOUT"
(NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16, NCCL_FLOAT32,
 NCCL_FLOAT64, NCCL_BFLOAT16) = range(10)
NCCL_CHAR, NCCL_INT, NCCL_HALF, NCCL_FLOAT, NCCL_DOUBLE = NCCL_INT8, NCCL_INT32, NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = range(5)
DTYPES = {NCCL_INT8: numpy.int8, NCCL_UINT8: numpy.uint8, NCCL_INT32: numpy.int32, NCCL_UINT32: numpy.uint32,
          NCCL_INT64: numpy.int64, NCCL_UINT64: numpy.uint64, NCCL_FLOAT16: numpy.float16,
          NCCL_FLOAT32: numpy.float32, NCCL_FLOAT64: numpy.float64, NCCL_BFLOAT16: numpy.uint16}
REDUCE = {NCCL_SUM: numpy.add, NCCL_PROD: numpy.multiply, NCCL_MAX: numpy.maximum, NCCL_MIN: numpy.minimum,
          NCCL_AVG: numpy.add}
ERRORS = {0: ("NCCL_ERROR_SUCCESS", "no error"), 1: ("NCCL_ERROR_UNHANDLED_CUDA_ERROR", "unhandled cuda error"),
          2: ("NCCL_ERROR_SYSTEM_ERROR", "unhandled system error"), 3: ("NCCL_ERROR_INTERNAL_ERROR", "internal error"),
          4: ("NCCL_ERROR_INVALID_ARGUMENT", "invalid argument"), 5: ("NCCL_ERROR_INVALID_USAGE", "invalid usage"),
          6: ("NCCL_ERROR_REMOTE_ERROR", "remote process exited or there was a network error")}
SYSTEM_ERROR, INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR = 2, 4, 5, 6
ALLREDUCE, REDUCE_, BROADCAST, ALLGATHER, REDUCESCATTER = range(5)
VERSION = 22703
available = True
_HEADER = struct.Struct("<BBBxiQQ")  # collective, dtype, op, root, count, payload bytes
_REPLY = struct.Struct("<BQ")  # status, payload bytes


class NcclError(RuntimeError):
    """cupy's ``NcclError``: ``status``; the message is NCCL's name and text (and what the emulator saw)."""

    def __init__(self, status):
        self.status = status
        name, text = ERRORS.get(status, ("NCCL_ERROR_UNKNOWN", "unknown error"))
        super().__init__(f"{name}: {text}")

    def __reduce__(self):
        return type(self), (self.status,)


def _error(status, detail):
    """An :class:`NcclError` whose message also says what the emulator saw."""
    error = NcclError(status)
    error.args = (f"{error.args[0]} ({detail})",)
    return error


def get_build_version():
    return VERSION


def get_version():
    return VERSION


def _recv_exactly(sock, n):
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _bfloat16_to_float32(u16):
    return (u16.astype(numpy.uint32) << 16).view(numpy.float32)


def _float32_to_bfloat16(f32):
    return (round_to_bfloat16(f32).view(numpy.uint32) >> 16).astype(numpy.uint16)


def _reduce(payloads, dtype_code, op):
    dtype = DTYPES[dtype_code]
    values = [numpy.frombuffer(p, dtype) for p in payloads]
    if dtype_code == NCCL_BFLOAT16:
        values = [_bfloat16_to_float32(v) for v in values]
    with numpy.errstate(all="ignore"):
        result = functools.reduce(REDUCE[op], values)
        if op == NCCL_AVG:
            result = (result / len(values)).astype(result.dtype)
    if dtype_code == NCCL_BFLOAT16:
        result = _float32_to_bfloat16(result)
    return result.tobytes()


class _Hub(threading.Thread):
    """The bootstrap root of one unique id: gathers every rank's n-th call, answers each with its result."""

    def __init__(self):
        super().__init__(daemon=True, name="emulated-nccl-hub")
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        port = self.listener.getsockname()[1]
        tag = struct.pack("<HI", port, os.getpid()) + os.urandom(16)
        self.unique_id = (MAGIC + tag).ljust(NCCL_UNIQUE_ID_BYTES, b"\0")
        self.start()

    def run(self):
        ranks, ndev = {}, None
        while ndev is None or len(ranks) < ndev:
            conn, _ = self.listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            size, rank = struct.unpack("<ii", _recv_exactly(conn, 8))
            ndev = size if ndev is None else ndev
            if size != ndev or rank in ranks:
                conn.sendall(_REPLY.pack(INVALID_ARGUMENT, 0))
                conn.close()
                continue
            ranks[rank] = conn
        self.listener.close()
        conns = [ranks[r] for r in range(ndev)]
        try:
            while True:
                calls = []
                for conn in conns:
                    kind, dtype, op, root, count, nbytes = _HEADER.unpack(_recv_exactly(conn, _HEADER.size))
                    calls.append(((kind, dtype, op, root, count), _recv_exactly(conn, nbytes)))
                for conn, reply in zip(conns, self.answer(calls)):
                    conn.sendall(reply)
        except (ConnectionError, OSError):  # a rank closed its communicator or exited: the others see it
            for conn in conns:
                conn.close()

    @staticmethod
    def answer(calls):
        signature = calls[0][0]
        if any(c[0] != signature for c in calls):
            text = b"the ranks' calls disagree: " + repr([c[0] for c in calls]).encode()
            return [_REPLY.pack(INVALID_USAGE, len(text)) + text] * len(calls)
        kind, dtype, op, root, count = signature
        payloads = [p for _, p in calls]
        n = len(calls)
        if kind in (ALLREDUCE, REDUCE_, REDUCESCATTER):
            reduced = _reduce(payloads, dtype, op)
            if kind == ALLREDUCE:
                results = [reduced] * n
            elif kind == REDUCE_:
                results = [reduced if r == root else b"" for r in range(n)]
            else:
                part = len(reduced) // n
                results = [reduced[r * part:(r + 1) * part] for r in range(n)]
        elif kind == BROADCAST:
            results = [payloads[root]] * n
        else:
            results = [b"".join(payloads)] * n
        return [_REPLY.pack(0, len(r)) + r for r in results]


def get_unique_id():
    """A new unique id (128 bytes) naming a hub in this process."""
    return _Hub().unique_id


_group = threading.local()


def groupStart():
    _group.depth = getattr(_group, "depth", 0) + 1


def groupEnd():
    if getattr(_group, "depth", 0) <= 0:
        raise _error(INVALID_USAGE, "groupEnd without groupStart")
    _group.depth -= 1


_comm_ids = itertools.count(0x9000)


class NcclCommunicator:
    """``NcclCommunicator(ndev, commId, rank)``: rank ``rank`` of ``ndev``, on the current device."""

    def __init__(self, ndev, commId, rank, config=None):
        if not isinstance(commId, bytes):
            raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got {type(commId).__name__})")
        if len(commId) != NCCL_UNIQUE_ID_BYTES:
            raise ValueError(f"commId length {len(commId)} != {NCCL_UNIQUE_ID_BYTES}.")
        if not commId.startswith(MAGIC) or not 0 <= rank < ndev:
            raise _error(INVALID_ARGUMENT, "not an emulated NCCL unique id" if not commId.startswith(MAGIC)
                            else f"rank {rank} of {ndev}")
        port = struct.unpack("<H", commId[len(MAGIC):len(MAGIC) + 2])[0]
        self._ndev, self._rank, self._device = int(ndev), int(rank), getDevice()
        self._comm, self._lock = next(_comm_ids), threading.Lock()
        self._timeout = float(os.environ.get(TIMEOUT_ENV) or 300)
        try:
            self._sock = socket.create_connection(("127.0.0.1", port), timeout=self._timeout)
        except OSError as e:
            raise _error(SYSTEM_ERROR, f"cannot reach the unique id's bootstrap at 127.0.0.1:{port}: {e}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.sendall(struct.pack("<ii", self._ndev, self._rank))

    @staticmethod
    def initAll(devices):
        if isinstance(devices, list):
            devlist = devices
        elif isinstance(devices, int):
            devlist = list(range(devices))
        else:
            raise ValueError('"devices" should be an int or a list of int.')
        uid = get_unique_id()
        comms = []
        for rank, device_id in enumerate(devlist):
            with Device(device_id):
                comms.append(NcclCommunicator(len(devlist), uid, rank))
        return comms

    @property
    def comm(self):
        return self._comm

    def device_id(self):
        return self._device

    def rank_id(self):
        return self._rank

    def size(self):
        return self._ndev

    def destroy(self):
        if self._comm:
            self._sock.close()
            self._comm = 0

    abort = destroy

    def __del__(self):
        sock = getattr(self, "_sock", None)
        if sock is not None:
            sock.close()

    def check_async_error(self):
        """The emulated collectives raise where they fail: nothing is pending."""

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        self._call(ALLREDUCE, sendbuf, recvbuf, count, count, datatype, op, 0, stream)

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        self._call(REDUCE_, sendbuf, recvbuf if self._rank == root else None, count, count, datatype, op, root,
                   stream)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        self._call(BROADCAST, sendbuff if self._rank == root else None, recvbuff, count, count, datatype, 0, root,
                   stream)

    def bcast(self, buff, count, datatype, root, stream):
        self.broadcast(buff, buff, count, datatype, root, stream)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
        self._call(REDUCESCATTER, sendbuf, recvbuf, recvcount * self._ndev, recvcount, datatype, op, 0, stream)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        self._call(ALLGATHER, sendbuf, recvbuf, count, count * self._ndev, datatype, 0, 0, stream)

    def _buffer(self, ptr, count, datatype):
        """The Ref of ``count`` elements at device address ``ptr`` (on this communicator's device)."""
        if datatype not in DTYPES:
            raise _error(INVALID_ARGUMENT, f"datatype {datatype}")
        dtype = numpy.dtype(DTYPES[datatype])
        nbytes = count * dtype.itemsize
        if nbytes:
            alloc = allocations.lookup(ptr, nbytes)
            if alloc.device_id != self._device:
                raise _error(INVALID_ARGUMENT, f"buffer {ptr:#x} is on device {alloc.device_id}, the communicator "
                                f"on device {self._device}")
        return streams.Ref(int(ptr), (nbytes,), (1,), numpy.dtype(numpy.uint8), self._device)

    def _call(self, kind, sendbuf, recvbuf, send_count, recv_count, datatype, op, root, stream):
        if not self._comm:
            raise _error(INVALID_ARGUMENT, "the communicator was destroyed")
        if not 0 <= root < self._ndev or op not in REDUCE:
            raise _error(INVALID_ARGUMENT, f"root {root}, op {op}")
        send = self._buffer(sendbuf, send_count, datatype) if sendbuf is not None else None
        recv = self._buffer(recvbuf, recv_count, datatype) if recvbuf is not None else None
        header = (kind, datatype, op, root, send_count)
        with Device(self._device):
            streams.submit(functools.partial(self._exchange, header), send, recv, name=f"nccl {kind}",
                           stream=streams.stream_from_ptr(stream))

    def _exchange(self, header, send, recv):
        payload = send.tobytes() if send is not None else b""
        with self._lock:
            try:
                self._sock.settimeout(self._timeout)
                self._sock.sendall(_HEADER.pack(*header, len(payload)) + payload)
                status, nbytes = _REPLY.unpack(_recv_exactly(self._sock, _REPLY.size))
                reply = _recv_exactly(self._sock, nbytes)
            except socket.timeout:
                raise _error(SYSTEM_ERROR, f"rank {self._rank} waited {self._timeout:g} s for the other ranks "
                                f"({TIMEOUT_ENV})") from None
            except (ConnectionError, OSError) as e:
                raise _error(REMOTE_ERROR, f"rank {self._rank}: {e}") from None
        if status:
            raise _error(status, reply.decode(errors="replace"))
        if recv is not None and reply:
            recv[...] = numpy.frombuffer(reply, numpy.uint8)
