"""The compiled part of kernels/threadpool.py's product threads (imported at the first shared product): a product's piece
described as a row of integers (a job), the loop a product thread waits in, and the calling thread's post and wait.

A job is one of four kinds, each the call the single-threaded path would make for that piece, so a piece's bits are
the same on either thread:

- ``SGEMM``: OpenBLAS's ``cblas_sgemm`` (row-major, alpha 1, beta 0 or 1) for ``COUNT`` matrices ``SA`` / ``SB`` /
  ``SC`` floats apart, called through its address (an ILP64 build takes 64-bit integers);
- ``GEMM`` / ``STREAM``: thin_gemm's kernels (kernels/_thin_jit.py) on the columns ``[LO, HI)`` of C-contiguous
  matrices (``GEMM``: ``WIDTH`` columns at a time, then 16; with ``TRANS_B``, groups of 16 rows of b stored as bt);
- ``PRODUCT``: thin_gemm's ``product`` for the matrices ``[LO, HI)`` of stacks ``SA`` / ``SB`` / ``SC`` floats apart
  (a stride of 0: one matrix for all).

The flags a product thread and the calling thread share are 64-bit words read with acquire and written with release
ordering (x86: plain moves the compiler may not hoist out of a loop); going to sleep and posting each put a full fence
between their store and their load, so that a post either finds the thread awake or sees it asleep and wakes it. A
product thread sleeps and is woken through a futex, in compiled code too: waking it through a Python event cost the
poster 20-40 us and the thread then waited for the GIL, up to the interpreter's switch interval (5 ms).
"""
import numba
import numpy
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import _thin_jit

i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()

# a job's fields
KIND, A, B, C, M, N, K, LDA, LDB, LDC, SA, SB, SC, COUNT, LO, HI, TRANS_A, TRANS_B, BETA, WIDTH, BLOCKS, NBLOCKS, \
    FUNCTION, ILP64 = range(24)
FIELDS = 24
SGEMM, GEMM, STREAM, PRODUCT = 1, 2, 3, 4
# a product thread's words before its job: the jobs posted, claimed (by the thread, or taken back by the caller) and
# done (counts), its state, a request to sleep now
POSTED, CLAIMED, DONE, STATE, PARK = range(5)
JOB = 8  # the job's first word in a product thread's box (after the words above, in the box's first cache line)
AWAKE, ASLEEP = 0, 1  # box[STATE]: its low 32 bits are the futex a product thread sleeps on
SYS_FUTEX, FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE, SYS_SCHED_YIELD = 202, 128, 129, 24  # Linux x86-64
YIELD_EVERY = 64  # pauses between a waiting product thread's sched_yield calls (a few microseconds)


@intrinsic
def _load(typingctx, address):
    def codegen(context, builder, sig, args):
        return builder.load_atomic(builder.inttoptr(args[0], i64.as_pointer()), "acquire", 8)
    return types.int64(types.int64), codegen


@intrinsic
def _store(typingctx, address, value):
    def codegen(context, builder, sig, args):
        builder.store_atomic(args[1], builder.inttoptr(args[0], i64.as_pointer()), "release", 8)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64), codegen


@intrinsic
def _claim(typingctx, address, expected, value):
    def codegen(context, builder, sig, args):
        pair = builder.cmpxchg(builder.inttoptr(args[0], i64.as_pointer()), args[1], args[2], "acq_rel", "acquire")
        return builder.extract_value(pair, 1)
    return types.boolean(types.int64, types.int64, types.int64), codegen


@intrinsic
def _futex(typingctx, syscall, address, operation, value):
    # syscall(SYS_futex, address, operation, value, NULL, NULL, 0) through libc's syscall (variadic) at its address
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(i64, [i64], var_arg=True)
        zero = ir.Constant(i64, 0)
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [ir.Constant(i64, SYS_FUTEX)] + list(args[1:]) +
                     [zero, zero, zero])
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64, types.int64), codegen


@intrinsic
def _syscall0(typingctx, syscall, number):
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(i64, [i64], var_arg=True)
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [args[1]])
        return context.get_dummy_value()
    return types.void(types.int64, types.int64), codegen


@intrinsic
def _fence(typingctx):
    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _pause(typingctx):
    def codegen(context, builder, sig, args):
        builder.call(builder.module.declare_intrinsic("llvm.x86.sse2.pause", fnty=ir.FunctionType(
            ir.VoidType(), [])), [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _cycles(typingctx):
    def codegen(context, builder, sig, args):
        return builder.call(builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=ir.FunctionType(i64, [])),
                            [])
    return types.int64(), codegen


def _sgemm_intrinsic(index):
    @intrinsic
    def call(typingctx, function, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc):
        sig = types.void(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64, types.int64,
                         types.int64, types.int64, types.int64, types.float32, types.int64, types.int64)

        def codegen(context, builder, signature, args):
            fn, ta, tb, m_, n_, k_, a_, lda_, b_, ldb_, beta_, c_, ldc_ = args
            small = (lambda v: builder.trunc(v, i32)) if index is i32 else (lambda v: v)
            pointer = ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, index, index, index, f32, pointer, index, pointer,
                                                   index, f32, pointer, index])
            builder.call(builder.inttoptr(fn, fnty.as_pointer()), [
                ir.Constant(i32, 101), builder.trunc(ta, i32), builder.trunc(tb, i32), small(m_), small(n_),
                small(k_), ir.Constant(f32, 1.0), builder.inttoptr(a_, pointer), small(lda_),
                builder.inttoptr(b_, pointer), small(ldb_), beta_, builder.inttoptr(c_, pointer), small(ldc_)])
            return context.get_dummy_value()
        return sig, codegen
    return call


_sgemm32, _sgemm64 = _sgemm_intrinsic(i32), _sgemm_intrinsic(i64)


def _pointer_intrinsic(numba_type):
    @intrinsic
    def pointer(typingctx, address):
        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], context.get_value_type(numba_type).as_pointer())
        return types.CPointer(numba_type)(types.int64), codegen
    return pointer


_floats, _integers = _pointer_intrinsic(types.float32), _pointer_intrinsic(types.int64)

jit = numba.njit(nogil=True, cache=True)
_FIELD = {name: globals()[name] for name in ("A", "B", "C", "M", "N", "K", "LDA", "LDB", "LDC", "SA", "SB", "SC",
                                              "COUNT", "LO", "HI", "TRANS_A", "TRANS_B", "BETA", "WIDTH", "BLOCKS",
                                              "NBLOCKS", "FUNCTION", "ILP64")}


def job(kind, **fields):
    """A job of ``kind`` as a list of FIELDS integers: ``fields`` by their names above, array addresses as integers
    (threadpool.run_jobs takes a list of them)."""
    row = [0] * FIELDS
    row[KIND] = kind
    for name, value in fields.items():
        row[_FIELD[name]] = int(value)
    return row


@jit
def execute(job):
    """Compute the piece the job (an int64 array of FIELDS) describes, on this thread."""
    kind, blocks = job[KIND], _integers(job[BLOCKS])
    if kind == SGEMM:
        beta = numpy.float32(job[BETA])
        for i in range(job[COUNT]):
            a, b, c = job[A] + 4 * i * job[SA], job[B] + 4 * i * job[SB], job[C] + 4 * i * job[SC]
            if job[ILP64]:
                _sgemm64(job[FUNCTION], job[TRANS_A], job[TRANS_B], job[M], job[N], job[K], a, job[LDA], b, job[LDB],
                         beta, c, job[LDC])
            else:
                _sgemm32(job[FUNCTION], job[TRANS_A], job[TRANS_B], job[M], job[N], job[K], a, job[LDA], b, job[LDB],
                         beta, c, job[LDC])
        return
    m, n, k = job[M], job[N], job[K]
    cuts = numba.carray(blocks, (job[NBLOCKS], 2))
    if kind == PRODUCT:
        for i in range(job[LO], job[HI]):
            _thin_jit.product(numba.carray(_floats(job[A] + 4 * i * job[SA]), (m, k)),
                              numba.carray(_floats(job[B] + 4 * i * job[SB]), (k, n)),
                              numba.carray(_floats(job[C] + 4 * i * job[SC]), (m, n)), cuts)
        return
    a, c = numba.carray(_floats(job[A]), (m, k)), numba.carray(_floats(job[C]), (m, n))
    transposed = job[TRANS_B] != 0
    b = numba.carray(_floats(job[B]), (n, k) if transposed else (k, n))
    if kind == GEMM:
        lo, hi, width = job[LO], job[HI], job[WIDTH]
        whole = hi if transposed else lo + (hi - lo) // width * width  # then groups of 16 (hi - lo: a multiple of 16)
        _thin_jit.gemm(a, b, c, cuts, lo, whole, transposed, width)
        if whole < hi:
            _thin_jit.gemm(a, b, c, cuts, whole, hi, transposed, 16)
    else:
        _thin_jit.stream(a, b, c, cuts, job[LO], job[HI])


@jit
def serve(box, budget, syscall):
    """A product thread's loop, for ever: run each job posted to ``box`` (an int64 array); after ``budget`` cycles
    without one, or when asked to (``box[PARK]``), sleep on a futex on ``box[STATE]`` until the next post (``syscall``:
    the address of libc's ``syscall``)."""
    base = box.ctypes.data
    start, idle = _cycles(), 0
    while True:
        posted = _load(base + 8 * POSTED)
        if posted != _load(base + 8 * DONE):
            if _claim(base + 8 * CLAIMED, posted - 1, posted):
                execute(box[JOB:])
                _store(base + 8 * DONE, posted)
            start = _cycles()
        elif _load(base + 8 * PARK) != 0 or _cycles() - start > budget:
            _store(base + 8 * PARK, 0)
            _store(base + 8 * STATE, ASLEEP)
            _fence()
            if _load(base + 8 * POSTED) == _load(base + 8 * DONE):
                _futex(syscall, base + 8 * STATE, FUTEX_WAIT_PRIVATE, ASLEEP)  # returns at once if a post woke it
            _store(base + 8 * STATE, AWAKE)
            start = _cycles()
        else:
            idle += 1
            if idle % YIELD_EVERY == 0:
                _syscall0(syscall, SYS_SCHED_YIELD)  # a thread waiting for this core (parallel_for's) runs now
            _pause()


@jit
def post(box, job, syscall):
    """Give ``job`` to the product thread of ``box``, waking it if it sleeps."""
    box[JOB:JOB + FIELDS] = job
    base = box.ctypes.data
    _store(base + 8 * POSTED, _load(base + 8 * POSTED) + 1)
    _fence()
    if _load(base + 8 * STATE) == ASLEEP:
        _store(base + 8 * STATE, AWAKE)
        _futex(syscall, base + 8 * STATE, FUTEX_WAKE_PRIVATE, 1)


@jit
def wait(box, budget):
    """Wait, spinning, until the product thread of ``box`` has done its job, or do the job here if the thread has not
    started it (asleep, or not yet scheduled); False if ``budget`` cycles passed first."""
    base = box.ctypes.data
    posted = _load(base + 8 * POSTED)
    if _claim(base + 8 * CLAIMED, posted - 1, posted):
        execute(box[JOB:])
        _store(base + 8 * DONE, posted)
        return True
    start = _cycles()
    while _load(base + 8 * DONE) != _load(base + 8 * POSTED):
        if _cycles() - start > budget:
            return False
        _pause()
    return True


@jit
def park(box):
    """Ask the product thread of ``box`` to sleep now if it is waiting for a job (its core is wanted elsewhere)."""
    base = box.ctypes.data
    if _load(base + 8 * STATE) == AWAKE:
        _store(base + 8 * PARK, 1)
