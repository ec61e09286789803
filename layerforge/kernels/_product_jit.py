"""The compiled part of kernels/threadpool.py's product threads (imported at the first shared product): a product's piece
described as a row of integers (a job), the loop a product thread waits in, and the calling thread's post and wait.
The jobs of a product are made from its arrays (``sgemm_jobs``, ``matrix_jobs``, ``stack_jobs``) and run (``run``) in
one compiled call each: LeNet's products take 5-300 us, and the Python that built them cost 30-60 us.

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

from . import _thin_jit, compile_lock

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

jit = compile_lock.njit(nogil=True)
# the job builders read their arrays' addresses, shapes and strides only: one signature each (_thin_jit.INPUT2...)
_JOBS = types.Array(types.int64, 2, "C")
_FIELD = {name: globals()[name] for name in ("A", "B", "C", "M", "N", "K", "LDA", "LDB", "LDC", "SA", "SB", "SC",
                                              "COUNT", "LO", "HI", "TRANS_A", "TRANS_B", "BETA", "WIDTH", "BLOCKS",
                                              "NBLOCKS", "FUNCTION", "ILP64")}


def job(kind, **fields):
    """A job of ``kind`` as an int64 array of FIELDS: ``fields`` by their names above, array addresses as integers
    (threadpool.run_jobs takes a list of them, or an array of rows; :func:`cut_jobs` cuts one into pieces)."""
    row = numpy.zeros(FIELDS, numpy.int64)
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


@compile_lock.cfunc(types.void(types.CPointer(types.int64)))
def execute_job(job):
    """:func:`execute` on the job at the address ``job``, as a C function: the loops below call it through its
    address (``execute_job.address``, an argument of theirs), so that each of them does not compile execute's code,
    and the kernels it calls, again (numba optimises a callee's code anew inside each caller: 1.4-3 s apiece)."""
    execute(numba.carray(job, (FIELDS,)))


@intrinsic
def _call_job(typingctx, function, job):
    # execute_job at the address `function` on the job at the address `job`
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [i64.as_pointer()])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [builder.inttoptr(args[1], i64.as_pointer())])
        return context.get_dummy_value()
    return types.void(types.int64, types.int64), codegen


@jit
def serve(box, budget, syscall, function):
    """A product thread's loop, for ever: run each job posted to ``box`` (an int64 array) by the execute_job at
    ``function``; after ``budget`` cycles without one, or when asked to (``box[PARK]``), sleep on a futex on
    ``box[STATE]`` until the next post (``syscall``: the address of libc's ``syscall``)."""
    base = box.ctypes.data
    start, idle = _cycles(), 0
    while True:
        posted = _load(base + 8 * POSTED)
        if posted != _load(base + 8 * DONE):
            if _claim(base + 8 * CLAIMED, posted - 1, posted):
                _call_job(function, base + 8 * JOB)
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
def wake(box, syscall):
    """Wake the product thread of ``box`` if it sleeps (or withdraw a request to sleep it has not yet acted on), so
    that it is spinning again by the next post: a futex wake-up takes the thread tens of microseconds on these
    machines, which a product that follows at once would otherwise wait for."""
    base = box.ctypes.data
    _store(base + 8 * PARK, 0)
    _fence()
    if _load(base + 8 * STATE) == ASLEEP:
        _store(base + 8 * STATE, AWAKE)
        _futex(syscall, base + 8 * STATE, FUTEX_WAKE_PRIVATE, 1)


@jit
def wait(box, budget, function):
    """Wait, spinning, until the product thread of ``box`` has done its job, or do the job here (the execute_job at
    ``function``) if the thread has not started it (asleep, or not yet scheduled); False if ``budget`` cycles passed
    first."""
    base = box.ctypes.data
    posted = _load(base + 8 * POSTED)
    if _claim(base + 8 * CLAIMED, posted - 1, posted):
        _call_job(function, base + 8 * JOB)
        _store(base + 8 * DONE, posted)
        return True
    start = _cycles()
    while _load(base + 8 * DONE) != _load(base + 8 * POSTED):
        if _cycles() - start > budget:
            return False
        _pause()
    return True


@jit
def run(boxes, jobs, syscall, budget, function):
    """Compute the pieces ``jobs`` (an int64 array, a job per row) describe: ``jobs[1:len(boxes) + 1]`` posted to the
    product threads whose boxes are at the addresses ``boxes``, the first and those left over on this thread, then
    each thread's waited for (or its job taken back), giving up the core between looks after ``budget`` cycles (a
    descheduled thread: a loaded machine); this thread's jobs by the execute_job at ``function`` (``jobs``
    C-contiguous). One compiled call, so that sharing a product costs Python one call."""
    posted = min(len(boxes), len(jobs) - 1)
    for t in range(posted):
        post(_box(boxes[t]), jobs[1 + t], syscall)
    at = jobs.ctypes.data
    _call_job(function, at)
    for j in range(1 + posted, len(jobs)):
        _call_job(function, at + 8 * FIELDS * j)
    for t in range(posted):
        box = _box(boxes[t])
        while not wait(box, budget, function):
            _syscall0(syscall, SYS_SCHED_YIELD)


@jit
def _box(address):
    return numba.carray(_integers(address), (JOB + FIELDS,))


@jit
def _cuts(units, pieces, unit, length, shift):
    # the bounds of `pieces` runs of whole units (of `unit` elements) over `length` elements, each inner bound moved
    # `shift` elements on (onto a cache line) and the last run ending at `length`
    cuts = numpy.empty(pieces + 1, numpy.int64)
    for p in range(pieces + 1):
        cuts[p] = 0 if p == 0 else length if p == pieces else min(units * p // pieces * unit + shift, length)
    return cuts


@jit
def cut_jobs(job, field, cuts, steps):
    """One job per piece ``[cuts[p], cuts[p + 1])`` of ``job`` (an int64 array): ``job[field]`` the piece's length
    (``field`` < 0: the fields LO and HI its bounds), each field ``f`` with ``steps[f]`` advanced by ``steps[f]``
    times the piece's start (the addresses of its first row, column or matrix)."""
    jobs = numpy.empty((len(cuts) - 1, FIELDS), numpy.int64)
    for p in range(len(cuts) - 1):
        lo, hi = cuts[p], cuts[p + 1]
        for f in range(FIELDS):
            jobs[p, f] = job[f] + steps[f] * lo
        if field < 0:
            jobs[p, LO], jobs[p, HI] = lo, hi
        else:
            jobs[p, field] = hi - lo
    return jobs


@jit
def _blas_layout(rows, columns, across, along):
    # (CBLAS_TRANSPOSE, leading dimension) of a matrix whose rows are `across` floats apart and its columns `along`:
    # 111 (NoTrans) with unit stride along its rows, 112 (Trans) along its columns, (0, 0) neither (a broadcast or a
    # strided axis)
    if along == 1 and (rows == 1 or across >= columns):
        return 111, max(across, columns, 1)
    if across == 1 and (columns == 1 or along >= rows):
        return 112, max(along, rows, 1)
    return 0, 0


MATRICES, ROWS, COLUMNS = 0, 1, 2  # the axis of the output sgemm_jobs cuts


@compile_lock.njit(_JOBS(_thin_jit.INPUT3, _thin_jit.INPUT3, _thin_jit.OUTPUT3, types.boolean, types.int64,
                          types.boolean, types.int64, types.int64, types.int64), nogil=True)
def sgemm_jobs(a, b, c, beta, function, ilp64, pieces, axis, small):
    """``SGEMM`` jobs for ``c[i] (+)= a[i] @ b[i]`` (float32 stacks (count, M, K), (count, K, N), (count, M, N), a
    stride of 0 for a broadcast one; ``beta`` 1: accumulate) by the cblas_sgemm at ``function`` (``ilp64``: of 64-bit
    integers), cut into ``pieces`` along ``axis``: runs of whole matrices, or of rows or columns of the one matrix in
    multiples of 16, columns cut where every row of c crosses a cache line. Empty where an array is not laid out as
    a BLAS matrix, or where a piece would have at most ``small`` multiply-adds or one row or column (OpenBLAS would
    compute it off its large path). One compiled call: Python's cost per product is what sharing small ones spends."""
    none = numpy.empty((0, FIELDS), numpy.int64)
    if function == 0 or a.strides[0] % 4 or a.strides[1] % 4 or a.strides[2] % 4 or b.strides[0] % 4 or \
            b.strides[1] % 4 or b.strides[2] % 4 or c.strides[0] % 4 or c.strides[1] % 4 or c.strides[2] % 4:
        return none
    count, m, k, n = a.shape[0], a.shape[1], a.shape[2], c.shape[2]
    a_at, a_across, a_along, a_stack = a.ctypes.data, a.strides[1] // 4, a.strides[2] // 4, a.strides[0] // 4
    b_at, b_across, b_along, b_stack = b.ctypes.data, b.strides[1] // 4, b.strides[2] // 4, b.strides[0] // 4
    c_at, c_across, c_along, c_stack = c.ctypes.data, c.strides[1] // 4, c.strides[2] // 4, c.strides[0] // 4
    if _blas_layout(m, n, c_across, c_along)[0] == 112:  # c^T is row-major: c^T (+)= b^T a^T
        a_at, b_at, a_stack, b_stack = b_at, a_at, b_stack, a_stack
        a_across, a_along, b_across, b_along = b_along, b_across, a_along, a_across
        c_across, c_along, m, n = c_along, c_across, n, m
        axis = COLUMNS if axis == ROWS else ROWS if axis == COLUMNS else axis
    trans_a, lda = _blas_layout(m, k, a_across, a_along)
    trans_b, ldb = _blas_layout(k, n, b_across, b_along)
    trans_c, ldc = _blas_layout(m, n, c_across, c_along)
    if trans_a == 0 or trans_b == 0 or trans_c != 111:
        return none
    job, steps = numpy.zeros(FIELDS, numpy.int64), numpy.zeros(FIELDS, numpy.int64)
    job[KIND], job[FUNCTION], job[ILP64], job[BETA], job[COUNT] = SGEMM, function, ilp64, beta, count
    job[TRANS_A], job[TRANS_B], job[M], job[N], job[K] = trans_a, trans_b, m, n, k
    job[A], job[LDA], job[B], job[LDB], job[C], job[LDC] = a_at, lda, b_at, ldb, c_at, ldc
    job[SA], job[SB], job[SC] = a_stack, b_stack, c_stack
    length = count if axis == MATRICES else n if axis == COLUMNS else m
    unit, shift = 1 if axis == MATRICES else 16, 0
    units = -(-length // unit)
    pieces = max(1, min(pieces, units))
    if axis == MATRICES:
        field, steps[A], steps[B], steps[C] = COUNT, 4 * a_stack, 4 * b_stack, 4 * c_stack
    elif axis == COLUMNS:
        field, steps[B], steps[C] = N, 4 * (1 if trans_b == 111 else ldb), 4
        if ldc % 16 == 0:  # two threads writing one cache line take turns for it, on every row
            shift = (-c_at) % 64 // 4
    else:
        field, steps[A], steps[C] = M, 4 * (lda if trans_a == 111 else 1), 4 * ldc
    jobs = cut_jobs(job, field, _cuts(units, pieces, unit, length, shift), steps)
    for p in range(pieces):
        rows, columns = jobs[p, M], jobs[p, N]
        if small and (rows <= 1 or columns <= 1 or rows * columns * k <= small):
            return none
    return jobs


@jit
def _matrix_job(kind, a, b, c, blocks):
    # the fields of a job of `kind` on matrices (or stacks of them) a, b, c, with OpenBLAS's blocks of the summed axis
    job = numpy.zeros(FIELDS, numpy.int64)
    job[KIND], job[A], job[B], job[C] = kind, a.ctypes.data, b.ctypes.data, c.ctypes.data
    job[M], job[N], job[K] = c.shape[-2], c.shape[-1], a.shape[-1]
    job[BLOCKS], job[NBLOCKS] = blocks.ctypes.data, blocks.shape[0]
    return job


@compile_lock.njit(_JOBS(types.int64, _thin_jit.INPUT2, _thin_jit.INPUT2, _thin_jit.OUTPUT2, _thin_jit.BLOCKS,
                          types.boolean, types.int64, types.int64, types.int64), nogil=True)
def matrix_jobs(kind, a, b, c, blocks, transposed, width, stop, threads):
    """thin_gemm's ``GEMM`` or ``STREAM`` jobs for ``c[:, :stop] = a @ b[:, :stop]`` (a (M, K), b (K, N) or,
    ``transposed``, bt (N, K), c (M, N), all C-contiguous; ``stop`` a multiple of ``width`` but transposed) shared by
    up to ``threads``: runs of whole groups of ``width`` columns, or, where there are fewer groups than threads, runs
    of whole groups of the kernels' rows of a (LeNet's second convolution at batch 1: 64 columns, 50 rows)."""
    job, steps = _matrix_job(kind, a, b, c, blocks), numpy.zeros(FIELDS, numpy.int64)
    job[TRANS_B], job[WIDTH] = transposed, width
    units, row_units = -(-stop // width), a.shape[0] // _thin_jit.ROWS
    if units >= threads or kind == STREAM or row_units < 2:
        return cut_jobs(job, -1, _cuts(units, max(1, min(threads, units)), width, stop, 0), steps)
    job[LO], job[HI] = 0, stop
    steps[A], steps[C] = 4 * a.shape[1], 4 * c.shape[1]
    return cut_jobs(job, M, _cuts(row_units, min(threads, row_units), _thin_jit.ROWS, a.shape[0], 0), steps)


@compile_lock.njit(*[_JOBS(a, _thin_jit.INPUT3, _thin_jit.OUTPUT3, _thin_jit.BLOCKS, types.int64)
                     for a in (_thin_jit.INPUT2, _thin_jit.INPUT3)], nogil=True)
def stack_jobs(a, b, c, blocks, pieces):
    """thin_gemm's ``PRODUCT`` jobs for ``c[i] = a[i] @ b[i]`` (stacks (count, M, K), (count, K, N), (count, M, N) of
    C-contiguous matrices, a stride of 0 between them for a broadcast one; ``a`` (M, K): one for all) in ``pieces``
    runs of whole matrices."""
    job = _matrix_job(PRODUCT, a, b, c, blocks)
    job[SA], job[SB], job[SC] = 0 if a.ndim == 2 else a.strides[0] // 4, b.strides[0] // 4, c.strides[0] // 4
    count = c.shape[0]
    return cut_jobs(job, -1, _cuts(count, pieces, 1, count, 0), numpy.zeros(FIELDS, numpy.int64))


@jit
def park(box):
    """Ask the product thread of ``box`` to sleep now if it is waiting for a job (its core is wanted elsewhere)."""
    base = box.ctypes.data
    if _load(base + 8 * STATE) == AWAKE:
        _store(base + 8 * PARK, 1)
