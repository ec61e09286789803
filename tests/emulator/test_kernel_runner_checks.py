"""The kernel executor is as strict as the device, and stricter where the device is undefined: barriers and warp
operations only some threads reach, launch limits, argument types against the C signature, crashes; and the
CUDA built-ins it provides behave as CUDA's (indices, warp shuffles and votes, atomics, dynamic shared memory).
"""
import numpy
import pytest

from layerforge.kernels import cuda, implicit_gemm
from layerforge.kernels.cuda import implicit_gemm as gpu_conv
from layerforge_emulator import kernel_runner
from layerforge_emulator.kernel_runner import CompileException, DevicePointer, KernelFault
from tests.emulator.helpers import implicit_gemm_without_barrier, launch, module, numpy_as_cupy, rand

P = DevicePointer.of

pytestmark = pytest.mark.usefixtures("built_kernels")


def build(text, options=(), name_expressions=()):
    return kernel_runner.compile_module(text, ("-std=c++17",) + tuple(options), name_expressions)


def run(text, name, grid, block, *args, shared_mem=0):
    build(text).function(name).launch(grid, block, [P(a) if isinstance(a, numpy.ndarray) else a for a in args],
                                      shared_mem)


INDICES = r'''
extern "C" __global__ void indices(int* out) {
    int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int nt = blockDim.x * blockDim.y * blockDim.z;
    out[b * nt + t] = b * 1000 + t;
}
'''


@pytest.mark.parametrize("grid,block", [((3,), (5,)), ((2, 3, 2), (4, 2, 3))])
def test_every_thread_of_every_block_runs_once_with_its_indices(grid, block):
    nb, nt = numpy.prod(grid), numpy.prod(block)
    out = numpy.full(nb * nt, -1, numpy.int32)
    run(INDICES, "indices", grid, block, out)
    numpy.testing.assert_array_equal(out.reshape(nb, nt), numpy.arange(nb)[:, None] * 1000 + numpy.arange(nt))


WARP = r'''
extern "C" __global__ void warp_ops(const float* x, float* sum, float* scan, float* bcast, unsigned* votes) {
    int i = threadIdx.x;
    float v = x[i];
    float s = v;
    for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    sum[i] = s;
    float p = v;
    for (int d = 1; d < 32; d <<= 1) {
        float o = __shfl_up_sync(0xffffffffu, p, d);
        if ((i & 31) >= d) p += o;
    }
    scan[i] = p;
    bcast[i] = __shfl_sync(0xffffffffu, v, 3, 8);  // lane 3 of each group of 8
    unsigned ballot = __ballot_sync(0xffffffffu, v > 0.5f);
    int any = __any_sync(0xffffffffu, v > 0.99f), all = __all_sync(0xffffffffu, v >= 0.0f);
    if ((i & 31) == 0) {
        votes[3 * (i >> 5)] = ballot;
        votes[3 * (i >> 5) + 1] = any;
        votes[3 * (i >> 5) + 2] = all;
    }
}
'''


def test_warp_shuffles_and_votes_exchange_among_the_lanes_of_each_warp():
    x = rand(64, numpy.float32, low=0.0, high=1.0)
    sum_, scan, bcast = (numpy.zeros(64, numpy.float32) for _ in range(3))
    votes = numpy.zeros(6, numpy.uint32)
    run(WARP, "warp_ops", 1, 64, x, sum_, scan, bcast, votes)
    warps = x.reshape(2, 32)
    numpy.testing.assert_allclose(sum_.reshape(2, 32), numpy.repeat(warps.sum(1, keepdims=True), 32, 1), rtol=1e-5)
    numpy.testing.assert_allclose(scan.reshape(2, 32), numpy.cumsum(warps, axis=1), rtol=1e-5)
    numpy.testing.assert_array_equal(bcast, numpy.repeat(x.reshape(8, 8)[:, 3], 8))
    for w in range(2):
        bits = sum(1 << lane for lane in range(32) if warps[w, lane] > 0.5)
        assert list(votes[3 * w:3 * w + 3]) == [bits, int((warps[w] > 0.99).any()), 1]


BUILTINS = r'''
extern "C" __global__ void builtins(const float* x, float* f, int* i, double* d) {
    int t = threadIdx.x;
    float v = x[t];
    float4 q = make_float4(v, 2.0f * v, 3.0f, 4.0f);
    f[t] = rsqrtf(v) + __expf(v) + fmaxf(q.y, q.z) + min(t, 3) + max(1.5f, v) + __saturatef(v - 0.5f);
    i[t] = __popc(t) + __float_as_int(1.0f) - 0x3f800000 + (int)(__brev(1u) >> 31) + __ffs(8) + __clz(1);
    d[t] = __shfl_sync(0xffffffffu, (double)t * 0.5, 31 - t) + __reduce_add_sync(0xffffffffu, t)
           + __popc(__match_any_sync(0xffffffffu, t % 4));
}
'''


def test_cuda_math_intrinsics_and_wide_warp_operations():
    x = rand(32, numpy.float32, low=0.1, high=0.9)
    f, i, d = numpy.zeros(32, numpy.float32), numpy.zeros(32, numpy.int32), numpy.zeros(32)
    run(BUILTINS, "builtins", 1, 32, x, f, i, d)
    t = numpy.arange(32)
    want = 1 / numpy.sqrt(x) + numpy.exp(x) + numpy.maximum(2 * x, 3) + numpy.minimum(t, 3) + numpy.maximum(1.5, x) \
        + numpy.clip(x - 0.5, 0, 1)
    numpy.testing.assert_allclose(f, want, rtol=1e-6)
    numpy.testing.assert_array_equal(i, [bin(k).count("1") + 1 + 4 + 31 for k in t])
    numpy.testing.assert_array_equal(d, (31 - t) * 0.5 + t.sum() + 8)


ATOMICS = r'''
extern "C" __global__ void atomics(float* f, double* d, int* i, unsigned* u, int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += blockDim.x * gridDim.x) {
        atomicAdd(f, 1.0f);
        atomicAdd(d, 0.5);
        atomicAdd(&i[0], 1);
        atomicMax(&i[1], k);
        atomicMin(&i[2], -k);
        atomicInc(&u[0], 9u);  // wraps to 0 after 9
        atomicCAS(&i[3], k, k + 1);  // only the thread that finds its own k there moves it on
    }
}
'''


def test_atomics_from_many_blocks_on_several_host_threads():
    f, d = numpy.zeros(1, numpy.float32), numpy.zeros(1, numpy.float64)
    i, u = numpy.array([0, -1, 1, 0], numpy.int32), numpy.zeros(1, numpy.uint32)
    n = 20000
    run(ATOMICS, "atomics", 40, 128, f, d, i, u, numpy.int32(n))
    assert (f[0], d[0], i[0], i[1], i[2], u[0]) == (n, n / 2, n, n - 1, -(n - 1), n % 10)
    assert 1 <= i[3] <= n


DYNAMIC_SHARED = r'''
extern __shared__ int file_scope[];  // every extern __shared__ array is the launch's dynamic shared memory
extern "C" __global__ void rotate(const int* x, int* y) {
    file_scope[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = file_scope[(threadIdx.x + 1) % blockDim.x];
}
extern "C" __global__ void reverse(const double* x, double* y) {
    extern __shared__ double buf[];
    int t = threadIdx.x, n = blockDim.x;
    buf[t] = x[blockIdx.x * n + t];
    __syncthreads();
    y[blockIdx.x * n + t] = buf[n - 1 - t];
}
extern "C" __global__ void counts(const int* x, int* out) {
    int v = x[threadIdx.x];
    int c = __syncthreads_count(v > 0), a = __syncthreads_and(v > 0), o = __syncthreads_or(v > 5);
    if (threadIdx.x == 0) { out[0] = c; out[1] = a; out[2] = o; }
}
'''


def test_dynamic_shared_memory_and_barriers_with_a_reduction():
    x, y = rand(3 * 100, numpy.float64), numpy.zeros(300)
    run(DYNAMIC_SHARED, "reverse", 3, 100, x, y, shared_mem=100 * 8)
    numpy.testing.assert_array_equal(y.reshape(3, 100), x.reshape(3, 100)[:, ::-1])
    v, out = numpy.arange(-3, 37, dtype=numpy.int32), numpy.zeros(3, numpy.int32)
    run(DYNAMIC_SHARED, "counts", 1, 40, v, out)
    assert list(out) == [36, 0, 1]
    w = numpy.zeros(40, numpy.int32)
    run(DYNAMIC_SHARED, "rotate", 1, 40, v, w, shared_mem=40 * 4)
    numpy.testing.assert_array_equal(w, numpy.roll(v, -1))


DIVERGENT = r'''
extern "C" __global__ void some_reach_the_barrier(float* x) {
    if (threadIdx.x < 16) return;
    __syncthreads();
    x[threadIdx.x] = 1.0f;
}
extern "C" __global__ void two_barriers(float* x) {
    if (threadIdx.x % 2) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    x[threadIdx.x] = 1.0f;
}
extern "C" __global__ void half_warp_shuffles(float* x) {
    float v = x[threadIdx.x];
    if (threadIdx.x < 16) v += __shfl_down_sync(0xffffffffu, v, 1);
    x[threadIdx.x] = v;
}
extern "C" __global__ void reads_outside_the_mask(float* x) {
    float v = x[threadIdx.x];
    if (threadIdx.x < 16) v += __shfl_down_sync(0x0000ffffu, v, 1);
    x[threadIdx.x] = v;
}
extern "C" __global__ void checks(const int* x) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    assert(x[i] >= 0);
}
extern "C" __global__ void crash(float* x, int n) {
    x[threadIdx.x + n] = 1.0f;
}
extern "C" __global__ void divide(int* x, int n) {
    x[threadIdx.x] = x[threadIdx.x] / n;
}
__device__ int deep(int n) {
    volatile char pad[4096];
    pad[0] = char(n);
    return n == 0 ? 0 : deep(n - 1) + pad[0];
}
extern "C" __global__ void recurse(int* x, int n) {
    x[threadIdx.x] = deep(n);
}
extern "C" __global__ void crash_in_one_block(float* x, int bad_block) {
    x[blockIdx.x * blockDim.x + threadIdx.x + (blockIdx.x == bad_block ? (1 << 30) : 0)] = 1.0f;
}
'''


def fault(name, *args, grid=(2,), block=(32,)):
    with pytest.raises(KernelFault) as error:
        run(DIVERGENT, name, grid, block, *args)
    return str(error.value)


def test_a_barrier_some_threads_never_reach_is_a_fault():
    message = fault("some_reach_the_barrier", numpy.zeros(32, numpy.float32))
    assert "kernel some_reach_the_barrier, block (0,0,0)" in message
    assert "__syncthreads() at line 4 is reached by 16 of the block's 32 threads: (16,0,0)-(31,0,0)" in message
    assert "16 exited without reaching it: (0,0,0)-(15,0,0)" in message


def test_threads_waiting_at_different_barriers_is_a_fault():
    message = fault("two_barriers", numpy.zeros(32, numpy.float32))
    assert "different barriers: __syncthreads() at line" in message and "two_barriers" in message


def test_a_shuffle_whose_mask_names_lanes_that_do_not_arrive_is_a_fault():
    message = fault("half_warp_shuffles", numpy.zeros(32, numpy.float32))
    assert "__shfl_down_sync at line 17 with mask 0xffffffff in warp 0" in message
    assert "(16,0,0)-(31,0,0) exited" in message


def test_a_shuffle_reading_a_lane_outside_its_mask_is_a_fault():
    message = fault("reads_outside_the_mask", numpy.zeros(32, numpy.float32))
    assert "lane 15 reads lane 16, which is not in the mask 0x0000ffff" in message


def test_assert_and_crashes_are_faults_naming_block_and_thread_and_the_process_survives():
    x = numpy.zeros(64, numpy.int32)
    x[37] = -1
    assert "block (1,0,0): thread (5,0,0): assertion 'x[i] >= 0' failed" in fault("checks", x)
    message = fault("crash", numpy.zeros(4, numpy.float32), numpy.int32(1 << 30))
    assert "kernel crash, block (0,0,0): thread (0,0,0): SIGSEGV (invalid memory access)" in message
    assert "SIGFPE (integer division by zero" in fault("divide", numpy.ones(32, numpy.int32), numpy.int32(0))
    assert "thread (0,0,0): stack overflow" in fault("recurse", numpy.zeros(32, numpy.int32), numpy.int32(10000))
    out = numpy.zeros(32, numpy.int32)
    run(INDICES, "indices", 1, 32, out)  # and the executor goes on
    assert out[31] == 31


def test_a_crash_on_a_worker_host_thread_is_a_fault(monkeypatch):
    monkeypatch.setenv(kernel_runner.THREADS_ENV, "2")
    x = numpy.zeros(64 * 256, numpy.float32)
    message = fault("crash_in_one_block", x, numpy.int32(63), grid=(64,), block=(256,))
    assert "kernel crash_in_one_block, block (63,0,0): thread (0,0,0): SIGSEGV" in message
    run(DIVERGENT, "crash_in_one_block", 64, 256, x, numpy.int32(-1))
    assert x.min() == 1.0


def test_launch_limits_are_checked():
    f = build(INDICES).function("indices")
    out = P(numpy.zeros(1, numpy.int32))
    for grid, block in [(1, 1025), (1, (1, 1, 65)), (1, (32, 33)), ((1, 65536), 1), (0, 1), ((2 ** 31, 1), 1)]:
        with pytest.raises(ValueError, match="invalid configuration"):
            f.launch(grid, block, (out,))
    conv = module("implicit_gemm", numpy.float32).function("conv_forward")
    assert conv.static_shared_bytes == 2 * 16 * 17 * 4  # a_tile and b_tile
    with pytest.raises(ValueError, match="2176 bytes of static and 47000 of dynamic shared memory exceed the 49152"):
        conv.launch(1, (16, 16), (None,) * 3 + (numpy.int32(1),) * 16, shared_mem=47000)


def test_arguments_are_checked_against_the_c_signature():
    f = module("softmax_loss", numpy.float32).function("softmax_loss_forward")
    assert [(p.name, p.ctype) for p in f.params[:5]] == [("prob", "const float*"), ("label", "const float*"),
                                                          ("loss", "float*"), ("valid", "float*"), ("count", "int")]
    buffers = [P(numpy.zeros(4, numpy.float32)) for _ in range(4)]
    good = buffers + [numpy.int32(v) for v in (4, 2, 2, 0, 0)]
    f.launch(1, 32, good)
    cases = [
        (buffers + [numpy.int64(4)] + good[5:], "parameter 4 'count' (int): got numpy.int64 (8 bytes); the device "
                                                "reads 4 bytes of int there"),
        ([P(numpy.zeros(4))] + good[1:], "parameter 0 'prob' (const float*): got a pointer to float64 data"),
        (good[:-1], "takes 9 arguments"),
        (buffers + [4] + good[5:], "parameter 4 'count' (int): expects a numpy scalar of its type, got int"),
        ([numpy.float32(0)] + good[1:], "expects a device pointer, got float32"),
        (buffers[:3] + [numpy.int32(0)] + good[4:], "expects a device pointer"),
        (buffers + [buffers[0]] + good[5:], "expects a value, got a device pointer"),
    ]
    for args, message in cases:
        with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
            f.launch(1, 32, args)


def test_a_launcher_passing_a_wrong_c_type_is_refused(monkeypatch):
    # planted: a launcher forgets that cupy passes a Python int as long long (kernel_args converts it to int)
    monkeypatch.setattr(cuda, "kernel_args", lambda args: tuple(numpy.int64(a) if type(a) is int else a for a in args))
    from layerforge.kernels.cuda import softmax_loss as gpu_softmax_loss
    prob, label = numpy.full((2, 3, 1), 1 / 3, numpy.float32), numpy.zeros(2, numpy.float32)
    with numpy_as_cupy(), pytest.raises(TypeError, match="parameter 4 'count' \\(int\\): got numpy.int64"):
        gpu_softmax_loss.softmax_loss_forward_gpu(prob, label, 2, 3, 1)


def test_compile_errors_name_file_and_line_and_unknown_kernels_are_a_lookup_error():
    with pytest.raises(CompileException) as error:
        build('extern "C" __global__ void k(float* x) {\n    x[0] = undeclared;\n}\n')
    assert ".cu:2:12: error: 'undeclared' was not declared in this scope" in str(error.value)
    with pytest.raises(LookupError, match="no kernel named 'indices_typo'.*its kernels: indices"):
        build(INDICES).function("indices_typo")


TEMPLATE = r'''
#ifndef SCALE
#error SCALE is a define of the options
#endif
template <typename T> __global__ void fill(T* x, T v, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = v * SCALE;
}
'''


def test_name_expressions_reach_template_kernels_and_nvrtc_only_options_are_dropped():
    m = build(TEMPLATE, ("-DSCALE=2", "--use_fast_math", "-arch=sm_90", "-lineinfo"), ("fill<double>", "fill<int>"))
    x = numpy.zeros(5)
    m.function("fill<double>").launch(1, 3, (P(x), numpy.float64(1.5), numpy.int32(5)))
    assert list(x) == [3.0] * 5
    assert [p.ctype for p in m.function("fill<int>").params] == ["int*", "int", "int"]
    with pytest.raises(LookupError):
        m.function("fill")  # C++ linkage: only its name expressions reach it, as with NVRTC


@pytest.mark.parametrize("barrier", [0, 1])
def test_a_syncthreads_removed_from_implicit_gemm_gives_a_wrong_result(barrier):
    # planted: the tiles' loads (0) or their use (1) no longer wait for the whole block
    broken = implicit_gemm_without_barrier(barrier)
    x, W = rand((2, 3, 7, 7), numpy.float32), rand((5, 3, 3, 3), numpy.float32, 1)
    y, y_broken = numpy.zeros((2, 5, 5, 5), numpy.float32), numpy.zeros((2, 5, 5, 5), numpy.float32)
    implicit_gemm.ImplicitGemmConv((3, 3, 1, 1, 0, 0, 1, 1), 1).forward(x, W, None, y)
    q = gpu_conv._geometry(x.shape, W.shape, (3, 3, 1, 1, 0, 0, 1, 1), 1)
    grid = (numpy.ceil(2 * 25 / 16).astype(int), 1, 1)
    launch("implicit_gemm", "conv_forward", numpy.float32, grid, (16, 16), (x, W, y_broken) + q, text=broken)
    assert not numpy.allclose(y_broken, y, rtol=1e-4, atol=1e-4)
    launch("implicit_gemm", "conv_forward", numpy.float32, grid, (16, 16), (x, W, y_broken) + q)
    numpy.testing.assert_allclose(y_broken, y, rtol=1e-4, atol=1e-4)


def test_a_forked_child_launches_with_host_threads_of_its_own(monkeypatch):
    # the parent's worker threads do not exist in a fork (a data worker, say): the child starts its own
    import os
    import signal
    import time
    monkeypatch.setenv(kernel_runner.THREADS_ENV, "2")
    nb, nt = 64, 256
    out = numpy.zeros(nb * nt, numpy.int32)
    run(INDICES, "indices", nb, nt, out)  # the parent's workers start
    pid = os.fork()
    if pid == 0:
        out[:] = -1
        run(INDICES, "indices", nb, nt, out)
        os._exit(0 if out[-1] == (nb - 1) * 1000 + nt - 1 else 1)
    deadline = time.monotonic() + 120
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's launch hung")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(done[1]) == 0
