"""kernels.threadpool: the threaded CPU bodies give the same bits as one thread, for any thread count."""
import threading

import numpy
import pytest

from layerforge.kernels import pooling, threadpool
from layerforge.kernels.im2col import col2im_cpu, im2col_cpu
from layerforge.kernels.output_size import conv_output_size


@pytest.fixture
def threads(monkeypatch):
    """Set the kernel thread count (every size threaded); restores the BLAS-following default afterwards."""
    monkeypatch.setattr(threadpool, "MIN_PARALLEL_ELEMENTS", 0)

    def use(n):
        threadpool.set_num_threads(n)
    yield use
    threadpool.set_num_threads(None)


def same_for_all_thread_counts(threads, compute):
    threads(1)
    reference = compute()
    for n in (2, 3, 5):
        threads(n)
        for got, want in zip(compute(), reference):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == want.tobytes(), f"{n} threads differ from 1"
    return reference


SHAPES = [(1, 3, 9, 11), (5, 7, 8, 8), (2, 1, 13, 6)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("geometry", [(3, 3, 1, 1, 1, 1), (5, 3, 2, 1, 2, 0), (1, 1, 1, 1, 0, 0)])
def test_im2col_and_col2im(threads, shape, geometry):
    x = numpy.random.RandomState(0).randn(*shape).astype(numpy.float32)
    kh, kw, sy, sx, ph, pw = geometry

    def compute():
        col = im2col_cpu(x, kh, kw, sy, sx, ph, pw)
        return col, col2im_cpu(col * 1.5, sy, sx, ph, pw, shape[2], shape[3])
    col, _ = same_for_all_thread_counts(threads, compute)
    assert col.shape == (shape[1], kh, kw, shape[0], conv_output_size(shape[2], kh, sy, ph),
                         conv_output_size(shape[3], kw, sx, pw))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("geometry", [(2, 2, 2, 2, 0, 0), (3, 3, 2, 2, 1, 1), (3, 3, 1, 1, 0, 0)])
def test_pooling(threads, shape, geometry):
    rng = numpy.random.RandomState(1)
    x = rng.randn(*shape).astype(numpy.float64)
    kh, kw, sy, sx, ph, pw = geometry
    out_h = -(-(shape[2] + 2 * ph - kh) // sy) + 1
    out_w = -(-(shape[3] + 2 * pw - kw) // sx) + 1
    if ph and (out_h - 1) * sy >= shape[2] + ph:
        out_h -= 1
    if pw and (out_w - 1) * sx >= shape[3] + pw:
        out_w -= 1
    gy = rng.randn(shape[0], shape[1], out_h, out_w)

    def compute():
        y, argmax = pooling.max_pooling_forward(x, kh, kw, sy, sx, ph, pw, out_h, out_w)
        gx = pooling.max_pooling_backward(gy, argmax, x.shape, kh, kw, sy, sx, ph, pw)
        ya = pooling.average_pooling_forward(x, kh, kw, sy, sx, ph, pw, out_h, out_w)
        ga = pooling.average_pooling_backward(gy, x.shape, kh, kw, sy, sx, ph, pw)
        return y, argmax, gx, ya, ga
    y, argmax, gx, ya, ga = same_for_all_thread_counts(threads, compute)
    # and the values are pooling's: the max of the first window, and gradients that add up
    assert y[0, 0, 0, 0] == x[0, 0, max(0, -ph):kh - ph, max(0, -pw):kw - pw].max()
    assert gx.sum() == pytest.approx(gy.sum())


def test_parallel_for_covers_the_range_once_and_nests_serially(threads):
    threads(3)
    seen, names = [], set()
    lock = threading.Lock()

    def body(lo, hi):
        inner = []
        threadpool.parallel_for(4, lambda a, b: inner.append((a, b)), work=10 ** 9)
        with lock:
            seen.extend(range(lo, hi))
            names.add(threading.current_thread().name.split("_")[0])
        assert inner == [(0, 4)]  # a body's own parallel_for runs on its thread
    threadpool.parallel_for(10, body, work=10 ** 9)
    assert sorted(seen) == list(range(10))
    assert len(names) == 2  # the caller and the pool's threads


def test_small_work_stays_on_the_calling_thread(monkeypatch):
    threadpool.set_num_threads(4)
    try:
        calls = []
        threadpool.parallel_for(100, lambda lo, hi: calls.append((lo, hi, threading.current_thread())),
                              work=threadpool.MIN_PARALLEL_ELEMENTS - 1)
        assert calls == [(0, 100, threading.current_thread())]
    finally:
        threadpool.set_num_threads(None)


def test_an_exception_in_a_piece_reaches_the_caller(threads):
    threads(2)

    def body(lo, hi):
        if lo > 0:
            raise ValueError(f"piece {lo}")
    with pytest.raises(ValueError, match="piece 5"):
        threadpool.parallel_for(10, body, work=10 ** 9)


def test_thread_count_follows_the_blas_setting(monkeypatch):
    monkeypatch.setattr(threadpool, "_blas_threads", lambda: 3)
    threadpool.set_num_threads(None)
    try:
        assert threadpool.num_threads() == 3
        threadpool.set_num_threads(1)
        assert threadpool.num_threads() == 1
    finally:
        threadpool.set_num_threads(None)
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "from layerforge.kernels import threadpool; import numpy; "
                          "print(threadpool.num_threads())"], capture_output=True, text=True, check=True,
                         env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "1"


@pytest.mark.parametrize("shape", [(1, 3, 20), (5, 4, 49), (3, 16, 7)])
@pytest.mark.parametrize("negative_slope", [None, 0, 0.1])
@pytest.mark.parametrize("batch_stats", [True, False])
def test_fused_batch_norm_scale_relu(threads, shape, negative_slope, batch_stats):
    from layerforge.kernels.fused_batch_norm import bn_scale_relu_backward, scale_shift_relu
    rng = numpy.random.RandomState(2)
    x_norm, gy = rng.randn(*shape).astype(numpy.float32), rng.randn(*shape).astype(numpy.float32)
    gamma, beta = rng.rand(shape[1]).astype(numpy.float32) + 0.5, rng.randn(shape[1]).astype(numpy.float32)
    inv_std = rng.rand(shape[1]).astype(numpy.float32) + 0.5

    def compute():
        y = scale_shift_relu(x_norm, gamma, beta, negative_slope, numpy.empty(shape, numpy.float32))
        g_gamma, g_beta = numpy.zeros_like(gamma), numpy.zeros_like(beta)
        gx = bn_scale_relu_backward(gy.copy(), y, x_norm, inv_std, gamma, negative_slope, batch_stats, g_gamma,
                                    g_beta, numpy.empty(shape, numpy.float32))
        return y, gx, g_gamma, g_beta
    y, gx, g_gamma, g_beta = same_for_all_thread_counts(threads, compute)
    z = gamma[None, :, None] * x_norm + beta[None, :, None]
    want = z if negative_slope is None else numpy.where(z > 0, z, z * negative_slope)
    numpy.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 7, 5, 5), (5, 16, 6, 3)])
@pytest.mark.parametrize("size,beta", [(5, 0.75), (3, 0.6)])
def test_lrn_across_channels(threads, shape, size, beta):
    from layerforge.kernels.lrn import lrn_across_backward, lrn_across_forward
    rng = numpy.random.RandomState(3)
    x, gy = rng.randn(*shape).astype(numpy.float32), rng.randn(*shape).astype(numpy.float32)

    def compute():
        y, scale = lrn_across_forward(x, size, 1e-4 / size, 1.0, beta)
        return y, scale, lrn_across_backward(x, scale, gy, size, 1e-4 / size, beta, numpy.empty_like(x))
    y, scale, _ = same_for_all_thread_counts(threads, compute)
    half = size // 2
    want = 1 + 1e-4 / size * (x[0, max(0, 2 - half):2 + half + 1, 1, 1] ** 2).sum()
    assert scale[0, 2, 1, 1] == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("shape", [(1, 3, 20), (5, 4, 49), (7, 2, 3)])
def test_batch_norm_statistics_and_gradient(threads, shape):
    from layerforge.kernels.batch_norm import batch_norm_backward, batch_stats
    rng = numpy.random.RandomState(4)
    x, gy = rng.randn(*shape).astype(numpy.float32) * 3 + 1, rng.randn(*shape).astype(numpy.float32)

    def compute():
        centred = numpy.empty_like(x)
        mean, var = batch_stats(x, centred)
        return mean, var, centred, batch_norm_backward(gy, centred, 1 / numpy.sqrt(var + 1e-5), numpy.empty_like(x))
    mean, var, _, _ = same_for_all_thread_counts(threads, compute)
    numpy.testing.assert_allclose(var, x.astype(numpy.float64).var(axis=(0, 2)), rtol=1e-6)


@pytest.mark.parametrize("batch", [1, 5, 6])
def test_eltwise_sum_and_split_backward(threads, batch):
    from layerforge.net import Net
    shape = [batch, 3, 4, 5]
    net = Net({"name": "t", "force_backward": True, "layers": [
        {"name": "in", "type": "Input", "top": ["a", "b"], "input": {"shape": [shape, shape]}},
        {"name": "sum", "type": "Eltwise", "bottom": ["a", "b"], "top": "s"},
        {"name": "double", "type": "Eltwise", "bottom": ["s", "s"], "top": "d", "eltwise": {"coeff": [1, 1]}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["d", "a"], "top": "loss"}]}, dtype="float64")
    rng = numpy.random.RandomState(5)
    net.blobs["a"].data[...], net.blobs["b"].data[...] = rng.randn(*shape), rng.randn(*shape)

    def compute():
        net.forward()
        net.backward()
        return net.blobs["d"].data.copy(), net.blobs["a"].diff.copy(), net.blobs["b"].diff.copy()
    d, ga, gb = same_for_all_thread_counts(threads, compute)
    a, b = net.blobs["a"].data, net.blobs["b"].data
    numpy.testing.assert_array_equal(d, 2 * (a + b))
    r = (2 * (a + b) - a) / batch  # EuclideanLoss: d loss / d d, and -r towards a
    numpy.testing.assert_allclose(gb, 2 * r, rtol=1e-12)
    numpy.testing.assert_allclose(ga, 2 * r - r, rtol=1e-12)


# (engine, input shape, geometry (kh, kw, sy, sx, ph, pw, dy, dx), groups, filters): Winograd F(2,3)'s compiled
# transforms and the IM2COL engine's threaded copies, lowering and scatter
CONV_CASES = [("WINOGRAD_F2", (1, 4, 7, 5), (3, 3, 1, 1, 1, 1, 1, 1), 1, 6),
              ("WINOGRAD_F2", (3, 6, 6, 9), (3, 3, 1, 1, 0, 0, 1, 1), 2, 6),
              ("WINOGRAD_F2", (2, 2, 5, 5), (3, 3, 1, 1, 2, 2, 1, 1), 1, 6),
              ("IM2COL", (1, 4, 7, 5), (3, 3, 1, 1, 1, 1, 1, 1), 1, 4),
              ("IM2COL", (3, 6, 9, 8), (5, 3, 2, 1, 2, 0, 1, 1), 2, 4),
              ("IM2COL", (2, 3, 6, 6), (3, 3, 1, 1, 0, 2, 2, 1), 1, 4)]


@pytest.mark.parametrize("engine_name,shape,geometry,groups,filters", CONV_CASES)
def test_convolution_engines(threads, engine_name, shape, geometry, groups, filters):
    from layerforge.kernels.output_size import conv_output_size
    from layerforge.kernels.implicit_gemm import ENGINES
    rng = numpy.random.RandomState(6 if engine_name == "WINOGRAD_F2" else 7)
    kh, kw, sy, sx, ph, pw, dy, dx = geometry
    x = rng.randn(*shape).astype(numpy.float32)
    W = rng.randn(filters, shape[1] // groups, kh, kw).astype(numpy.float32)
    b = rng.randn(filters).astype(numpy.float32)
    out_h = conv_output_size(shape[2], dy * (kh - 1) + 1, sy, ph)
    out_w = conv_output_size(shape[3], dx * (kw - 1) + 1, sx, pw)
    gy = rng.randn(shape[0], filters, out_h, out_w).astype(numpy.float32)
    engine = ENGINES[engine_name](geometry, groups)

    def compute():
        y = numpy.empty((shape[0], filters, out_h, out_w), numpy.float32)
        engine.forward(x, W, b, y)
        gW, gb, gx = numpy.zeros_like(W), numpy.zeros_like(b), numpy.empty_like(x)
        engine.backward(x, W, gy, gW, gb, gx)
        return y, gW, gb, gx
    y, gW, gb, gx = same_for_all_thread_counts(threads, compute)
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x.astype(numpy.float64), requires_grad=True)
    tW = torch.tensor(W.astype(numpy.float64), requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tW, torch.tensor(b.astype(numpy.float64)), stride=(sy, sx),
                                    padding=(ph, pw), dilation=(dy, dx), groups=groups)
    ty.backward(torch.tensor(gy.astype(numpy.float64)))
    numpy.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    numpy.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    numpy.testing.assert_allclose(gW, tW.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch", [1, 5])
def test_unfused_scale_layer(threads, batch):
    from layerforge.net import Net
    shape = [batch, 3, 4, 5]
    net = Net({"name": "t", "force_backward": True, "fuse_batch_norm": False, "layers": [
        {"name": "in", "type": "Input", "top": ["a", "t"], "input": {"shape": [shape, shape]}},
        {"name": "bn", "type": "BatchNorm", "bottom": "a", "top": "h"},
        {"name": "scale", "type": "Scale", "bottom": "h", "top": "h",
         "scale": {"bias_term": True, "filler": {"type": "uniform", "min": 0.5, "max": 2}}},
        {"name": "loss", "type": "EuclideanLoss", "bottom": ["h", "t"], "top": "loss"}]}, dtype="float64")
    rng = numpy.random.RandomState(8)
    net.blobs["a"].data[...], net.blobs["t"].data[...] = rng.randn(*shape), rng.randn(*shape)

    def compute():
        net.clear_param_diffs()
        net.forward()
        net.backward()
        return (net.blobs["h"].data.copy(), net.blobs["a"].diff.copy(), net.params["scale"][0].diff.copy(),
                net.params["scale"][1].diff.copy())
    h, _, g_gamma, g_beta = same_for_all_thread_counts(threads, compute)
    x_norm = net.layer_dict["bn"].x_norm.reshape(shape)
    gamma = net.params["scale"][0].data
    numpy.testing.assert_allclose(h, gamma[None, :, None, None] * x_norm + net.params["scale"][1].data[None, :, None, None],
                                  rtol=1e-12)
    gh = (h - net.blobs["t"].data) / batch  # EuclideanLoss
    numpy.testing.assert_allclose(g_beta, gh.sum(axis=(0, 2, 3)), rtol=1e-10)
    numpy.testing.assert_allclose(g_gamma, (gh * x_norm).sum(axis=(0, 2, 3)), rtol=1e-10)


def test_the_pool_starts_every_thread_at_once(monkeypatch):
    """concurrent.futures starts a thread within a submit and registers it for the interpreter's exit only after:
    a Ctrl-C raised in between (errors.interrupting) left a thread the exit waited for forever. The kernel pool
    starts all its threads when it is made, with the ending signals held."""
    monkeypatch.setitem(threadpool._state, "pool", None)
    pool = threadpool._pool(3)
    try:
        assert len(pool._threads) == 3 and all(t.is_alive() for t in pool._threads)
        assert threadpool._pool(2) is pool and len(pool._threads) == 3
    finally:
        pool.shutdown(wait=True)


def _column_jobs(a, bt, c, pieces):
    # thin_gemm's jobs for c = a @ bt.T: groups of 16 rows of bt, cut into `pieces` runs
    from layerforge.kernels import _product_jit as pj, thin_gemm

    blocks = thin_gemm._blocks(a.shape[1], False)
    cuts = [len(bt) // 16 * p // pieces * 16 for p in range(pieces)] + [len(bt)]
    return blocks, [pj.job(pj.GEMM, A=a.ctypes.data, B=bt.ctypes.data, C=c.ctypes.data, M=len(a), N=len(bt),
                           K=a.shape[1], TRANS_B=1, WIDTH=16, BLOCKS=blocks.ctypes.data, NBLOCKS=len(blocks), LO=lo,
                           HI=hi) for lo, hi in zip(cuts, cuts[1:])]


@pytest.mark.parametrize("spin_cycles", [1 << 30, 0])
@pytest.mark.parametrize("wakes", [True, False])
def test_run_jobs_on_product_threads_awake_asleep_or_never_scheduled(monkeypatch, spin_cycles, wakes):
    """A product thread spins for jobs (or sleeps at once, spin_cycles 0); a job it has not started when the caller
    is done with its own (here: a thread whose wake-up never comes) is taken back and computed by the caller."""
    monkeypatch.setattr(threadpool, "SPIN_CYCLES", spin_cycles)
    monkeypatch.setitem(threadpool._products, "threads", None)
    if not wakes:
        monkeypatch.setattr(threadpool._ProductThread, "_serve", lambda self: None)  # started, never serving
    rs = numpy.random.RandomState(1)
    a, bt = rs.randn(5, 300).astype(numpy.float32), rs.randn(333, 300).astype(numpy.float32)
    expected = numpy.empty((5, 333), numpy.float32)
    threadpool.set_num_threads(3)
    try:
        for _ in range(4):
            c = numpy.full((5, 333), numpy.nan, numpy.float32)
            blocks, jobs = _column_jobs(a, bt, c, 3)
            threadpool.run_jobs(jobs)
            for job in _column_jobs(a, bt, expected, 1)[1]:
                threadpool.product_jit().execute(numpy.array(job, numpy.int64))
            numpy.testing.assert_array_equal(c, expected)
        assert len(threadpool._products["threads"]) == 2
        if not wakes:  # every piece was taken back: no job is left posted
            assert all(t.box[0] == t.box[1] == t.box[2] == 4 for t in threadpool._products["threads"])
    finally:
        threadpool.set_num_threads(None)
    numpy.testing.assert_allclose(expected, a.astype(numpy.float64) @ bt.T, rtol=1e-4, atol=1e-3)


def test_the_kernels_reached_through_addresses_compile_once_for_every_layout():
    """The product jobs' builders and thin_gemm's gemm read their arrays through addresses: each is compiled for the
    one signature given in the code, whatever the arrays' layouts and read-only flags (numba compiled one per
    layout), and gemm's products have the same bits from writable and read-only operands."""
    from layerforge.kernels import _thin_jit, thin_gemm

    pj = threadpool.product_jit()
    rs = numpy.random.RandomState(3)
    a, b = rs.randn(2, 8, 40).astype(numpy.float32), rs.randn(2, 40, 64).astype(numpy.float32)
    c = numpy.empty((2, 8, 64), numpy.float32)
    strided = numpy.empty((2, 8, 80), numpy.float32)[:, :, ::2]
    strided[...] = a
    blocks = thin_gemm._blocks(40, False)
    for x in (a, numpy.asfortranarray(a), strided, numpy.broadcast_to(a[:1], a.shape)):
        for y in (b, numpy.asfortranarray(b), numpy.broadcast_to(b[:1], b.shape)):
            assert len(pj.sgemm_jobs(x, y, c, False, 0, False, 2, pj.MATRICES, 0)) == 0  # no BLAS given: no jobs
            assert len(pj.stack_jobs(x, y, c, blocks, 2)) == 2
        assert len(pj.stack_jobs(x[0], b, c, blocks, 1)) == 1
    assert len(pj.sgemm_jobs.signatures) == 1 and len(pj.stack_jobs.signatures) == 2

    results = []
    for x, y in ((a[0], b[0]), (numpy.broadcast_to(a[0], a.shape)[1], numpy.broadcast_to(b[0], b.shape)[1])):
        out = numpy.full((8, 64), numpy.nan, numpy.float32)
        _thin_jit.gemm(x, y, out, blocks, 0, 64, False, 64)
        results.append(out)
    numpy.testing.assert_array_equal(results[0], results[1])
    numpy.testing.assert_allclose(results[0], a[0].astype(numpy.float64) @ b[0], rtol=1e-4, atol=1e-4)
    assert len(_thin_jit.gemm.signatures) == 1


def test_parallel_for_asks_spinning_product_threads_to_sleep_and_wakes_them_after(monkeypatch):
    """A product thread spinning for its next job would take a core from parallel_for's threads: parallel_for asks
    it to sleep while its pieces run, and wakes it when its own piece is done, so that the thread spins again by the
    next product (a futex wake-up takes tens of microseconds, which that product would wait for)."""
    monkeypatch.setattr(threadpool, "SPIN_CYCLES", 1 << 33)
    monkeypatch.setitem(threadpool._products, "threads", None)
    monkeypatch.setattr(threadpool, "MIN_PARALLEL_ELEMENTS", 0)
    rs = numpy.random.RandomState(2)
    a, bt = rs.randn(5, 300).astype(numpy.float32), rs.randn(64, 300).astype(numpy.float32)
    pj = threadpool.product_jit()

    def state_becomes(box, state):
        for _ in range(2000):
            if box[pj.STATE] == state:
                return True
            threading.Event().wait(0.001)
        return False

    threadpool.set_num_threads(2)
    try:
        c = numpy.empty((5, 64), numpy.float32)  # alive while the jobs write it
        threadpool.run_jobs(_column_jobs(a, bt, c, 2)[1])
        box = threadpool._products["threads"][0].box
        assert state_becomes(box, pj.AWAKE)  # spinning: its budget is seconds
        seen = []
        threadpool.parallel_for(2, lambda lo, hi: seen.append(state_becomes(box, pj.ASLEEP)) if lo == 0 else None,
                                work=1)
        assert seen == [True]
        assert state_becomes(box, pj.AWAKE)
        threadpool.run_jobs(_column_jobs(a, bt, c, 2)[1])
        numpy.testing.assert_allclose(c, a.astype(numpy.float64) @ bt.T, rtol=1e-4, atol=1e-3)
    finally:
        threadpool.set_num_threads(None)


def test_a_forked_child_starts_its_own_product_threads():
    import multiprocessing

    rs = numpy.random.RandomState(3)
    a, bt = rs.randn(5, 300).astype(numpy.float32), rs.randn(64, 300).astype(numpy.float32)
    threadpool.set_num_threads(2)
    try:
        c = numpy.empty((5, 64), numpy.float32)
        threadpool.run_jobs(_column_jobs(a, bt, c, 2)[1])
        assert threadpool._products["threads"]
        with multiprocessing.get_context("fork").Pool(1) as pool:
            child = pool.apply(_product_in_a_child, (a, bt))
    finally:
        threadpool.set_num_threads(None)
    numpy.testing.assert_allclose(child, a.astype(numpy.float64) @ bt.T, rtol=1e-4, atol=1e-3)


def _product_in_a_child(a, bt):
    assert threadpool._products["threads"] is None  # the parent's threads did not cross the fork
    threadpool.set_num_threads(2)
    c = numpy.empty((5, 64), numpy.float32)
    threadpool.run_jobs(_column_jobs(a, bt, c, 2)[1])
    assert len(threadpool._products["threads"]) == 1
    return c


@pytest.mark.parametrize("sizes", [[3], [70000], [5, 200000, 7, 65536, 1], [131072] * 4 + [3]])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fill_zeros_zeroes_every_array_whole_on_any_number_of_threads(monkeypatch, sizes, threads):
    from layerforge.kernels import threadpool
    monkeypatch.setattr(threadpool, "num_threads", lambda: threads)
    arrays = [numpy.full((s,), 7.0, numpy.float32) for s in sizes]
    room = numpy.full(10, 7.0)
    arrays.append(room[2:8].reshape(2, 3))  # contiguous, inside a larger array
    threadpool.fill_zeros(arrays)
    assert all((a == 0).all() for a in arrays)
    assert (room[:2] == 7).all() and (room[8:] == 7).all()


# a process whose main thread runs parallel_for within errors.interrupting (as a command does) and is signalled
# (SIGINT) while its other piece still runs: "window", every future's condition patched to signal just after the
# main thread takes it in Future.result (threading.Condition.__enter__ is Python: an Interrupted raised there left
# the condition held, the kernel thread waited on it for ever to post its result, and the exit waited for that
# thread); "stuck", the other piece runs for 60 s (as one waiting for a lock the signal left held would). Prints
# how parallel_for ended; the process must then exit
INTERRUPTED_PIECES = """
import os, signal, sys, threading, time
import concurrent.futures._base as futures
import numpy
from layerforge.errors import Interrupted, interrupting
from layerforge.kernels import threadpool

class Signalling(threading.Condition):
    def __enter__(self):
        taken = super().__enter__()
        if threading.current_thread() is threading.main_thread() and sys._getframe(1).f_code.co_name == "result":
            os.kill(os.getpid(), signal.SIGINT)
        return taken

if sys.argv[1] == "window":
    make = futures.Future.__init__
    def patched(self):
        make(self)
        self._condition = Signalling()
    futures.Future.__init__ = patched
else:
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
threadpool.set_num_threads(2)
x = numpy.ones(1 << 20, numpy.float32)

def body(lo, hi):
    if threading.current_thread() is not threading.main_thread():
        time.sleep(60.0 if sys.argv[1] == "stuck" else 0.3)
    x[lo:hi] *= 2

started = time.monotonic()
try:
    with interrupting():
        threadpool.parallel_for(len(x), body, work=len(x))
    print("ended", flush=True)
except Interrupted as e:
    print(f"interrupted by {e} after {time.monotonic() - started:.1f} s", flush=True)
os._exit(0) if sys.argv[1] == "stuck" else None  # the piece sleeping 60 s is a thread the exit would wait for
"""


@pytest.mark.parametrize("case", ["window", "stuck"])
def test_a_signal_while_parallel_for_waits_for_a_piece_ends_it_and_the_process(case):
    from tests.test_cli import run_python
    out = run_python(INTERRUPTED_PIECES, case, timeout=60)
    if case == "window":  # the main thread takes no future's condition, so the patch never signals
        assert out.strip() == "ended", out
    else:  # signalled 0.5 s in, the other piece waited for INTERRUPTED_PIECES_WAIT, not its 60 s
        took = float(out.split(" after ")[1].split()[0])
        assert 0.5 + threadpool.INTERRUPTED_PIECES_WAIT - 0.2 <= took < 20.0, out
