"""The kernels under ThreadSanitizer and AddressSanitizer (``LAYERFORGE_EMULATED_GPU_SANITIZER``): layerforge's
own kernels run clean and still agree with the CPU bodies; planted races and out-of-bounds accesses are reported
as a KernelFault naming kernel, GPU thread, access and source line.

Small shapes and float32 only: each sanitized launch is a process of its own (about 0.1 s), and each source is
built once per sanitizer (about 1 s here).
"""
import re

import numpy
import pytest

from layerforge.kernels import cuda
from layerforge.kernels.cuda import implicit_gemm as gpu_conv
from layerforge_emulator import kernel_runner
from layerforge_emulator.kernel_runner import DevicePointer, KernelFault
from tests.emulator import helpers
from tests.emulator import test_kernel_runner as kernels
from tests.emulator.helpers import implicit_gemm_without_barrier, launch, numpy_as_cupy, rand

SANITIZERS = ["thread", "address"]
F = numpy.float32

pytestmark = pytest.mark.usefixtures("sanitized_kernels")


@pytest.fixture(params=SANITIZERS)
def sanitizer(request, monkeypatch):
    monkeypatch.setenv(kernel_runner.SANITIZER_ENV, request.param)
    return request.param


# one case of each source's kernels, forward and backward, on shapes of a few blocks
CASES = {
    "im2col": lambda: kernels.test_im2col_col2im(F, (3, 2, 2, 1, 0, 1, 1, 1)),
    # 3x3 with padding, its bounds checks under AddressSanitizer (ThreadSanitizer's shared tiles, barriers and
    # atomics are those of the next launches, which have more blocks: ~1.4 s a launch under it, for nothing more);
    # then two groups of 17 channels, 1x1 (3x3 would be 153 columns of the filter gradient): two blocks along x
    # (25 positions, 17 columns), y (17 rows) and z (the groups)
    "implicit_gemm": lambda: (kernel_runner.default_sanitizer() == "thread"
                              or kernels.check_implicit_gemm_conv(F, (3, 3, 1, 1, 1, 1, 1, 1), 1, (1, 2, 5, 5), 3),
                              kernels.check_implicit_gemm_conv(F, (1, 1, 1, 1, 0, 0, 1, 1), 2, (1, 34, 5, 5), 34)),
    "pooling": lambda: kernels.test_pooling(F, (3, 3), (2, 2), (1, 1)),
    "lrn": lambda: kernels.test_lrn(F, 5, 0.75),
    "softmax_loss": lambda: kernels.test_softmax_loss(F, 2),
    "batch_norm": lambda: kernels.test_batch_norm(F, (2, 2, 40)),
    "fused_batch_norm": lambda: kernels.test_fused_batch_norm(F, (2, 2, 40), 0.1),
}


def test_every_source_has_a_case():
    assert set(CASES) == set(cuda.sources())


@pytest.mark.parametrize("stem", sorted(CASES))
def test_layerforge_kernels_run_clean_under_the_sanitizer(stem, sanitizer):
    del helpers.LAUNCHES[:]
    with numpy_as_cupy():
        CASES[stem]()
    grids = {}
    for name, grid in helpers.LAUNCHES:
        grids.setdefault(name, []).append(grid)
    # every kernel that reduces across threads ran once with two blocks or more along every axis it uses
    for kernel, axes in reducing_kernels(cuda.sources()[stem].read_text()).items():
        assert kernel in grids, f"{stem}.cu's {kernel} reduces across threads and its case does not launch it"
        assert any(all(g["xyz".index(axis)] >= 2 for axis in axes) for g in grids[kernel]), (kernel, axes, grids)


REDUCES = re.compile(r"__shared__|\batomic\w*\(|__shfl\w*\(")


def _functions(text):
    """The top-level functions of a .cu text: name -> (is a kernel, body)."""
    found = {}
    for m in re.finditer(r"^[^\n;{}#/]*?\b(\w+)\s*\([^;{]*?\)\s*\{", text, re.M):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        found[m.group(1)] = ("__global__" in m.group(0), text[m.end():i])
    return found


def reducing_kernels(text):
    """The kernels of ``text`` that reduce across threads (shared memory, atomics, warp shuffles, themselves or in a
    device function they call) -> the block axes they read (``blockIdx.x/y/z``)."""
    functions = _functions(text)
    reducing = {name for name, (_, body) in functions.items() if REDUCES.search(body)}
    grew = True
    while grew:
        callers = {name for name, (_, body) in functions.items()
                   if any(re.search(rf"\b{callee}\s*[<(]", body) for callee in reducing)}
        grew = not callers <= reducing
        reducing |= callers
    return {name: sorted(set(re.findall(r"blockIdx\.([xyz])", body))) for name, (kernel, body) in functions.items()
            if kernel and name in reducing}


def test_the_reducing_kernels_are_found():
    found = {stem: sorted(reducing_kernels(path.read_text())) for stem, path in cuda.sources().items()}
    assert found["implicit_gemm"] == ["conv_backward_data", "conv_backward_filter", "conv_forward"]
    assert reducing_kernels(cuda.sources()["implicit_gemm"].read_text())["conv_forward"] == ["x", "y", "z"]
    assert found["batch_norm"] and found["fused_batch_norm"] and not found["im2col"]


def _conv_forward(text, sanitizer):
    x, W = rand((1, 2, 5, 5), F), rand((3, 2, 3, 3), F, 1)
    y = numpy.zeros((1, 3, 3, 3), F)
    q = gpu_conv._geometry(x.shape, W.shape, (3, 3, 1, 1, 0, 0, 1, 1), 1)
    launch("implicit_gemm", "conv_forward", F, (1, 1, 1), (16, 16), (x, W, y) + q, sanitizer=sanitizer, text=text)


def test_a_syncthreads_removed_from_implicit_gemm_is_a_race_report():
    with pytest.raises(KernelFault) as error:
        _conv_forward(implicit_gemm_without_barrier(0), "thread")
    message = str(error.value)
    assert message.startswith("kernel conv_forward, block (0,0,0), thread (")
    assert "ThreadSanitizer: data race" in message
    assert "Location: the block's __shared__ memory" in message
    # the tile's store and the read of another thread's element, with their lines in the planted source
    text = implicit_gemm_without_barrier(0)
    store = line_of(text, r"a_tile\[threadIdx\.y\]\[threadIdx\.x\] = a\(")
    read = line_of(text, r"acc \+= a_tile\[threadIdx\.y\]\[t\]")
    assert "tiled_product at " in message and f".cu:{store}" in message and f".cu:{read}" in message


ATOMIC_ADD = re.compile(r"atomicAdd\(\s*&\s*(?P<target>[^;]+?)\s*,\s*(?P<value>[^;]+?)\)\s*;")
KERNEL = re.compile(r'extern "C" __global__ void (\w+)\(')


def line_of(text, pattern):
    """The line (1-based) of the one match of ``pattern`` in ``text``; fails when there is not exactly one."""
    found = [m.start() for m in re.finditer(pattern, text)]
    assert len(found) == 1, f"{pattern!r} is in the kernel source {len(found)} times, not once: the planted site moved"
    return text.count("\n", 0, found[0]) + 1


def atomic_sites():
    """Every ``atomicAdd(&target, value);`` of layerforge's .cu sources: (stem, kernel, match index)."""
    sites = []
    for stem, path in sorted(cuda.sources().items()):
        text = path.read_text()
        for i, m in enumerate(ATOMIC_ADD.finditer(text)):
            kernels = [k.group(1) for k in KERNEL.finditer(text, 0, m.start())]
            sites.append((stem, kernels[-1], i))
    return sites


def _filter_gradient(text, sanitizer):
    # two blocks along every axis: 17 output channels (y), 18 = 2 x 3 x 3 columns (x), 18 positions in chunks
    # of 16 (z); every element of gW gets the partial sums of both z blocks
    x, W = rand((2, 2, 5, 5), F), rand((17, 2, 3, 3), F, 1)
    gy, gW = rand((2, 17, 3, 3), F, 2), numpy.zeros_like(W)
    q = gpu_conv._geometry(x.shape, W.shape, (3, 3, 1, 1, 0, 0, 1, 1), 1)
    launch("implicit_gemm", "conv_backward_filter", F, (2, 2, 2), (16, 16), (x, gy, gW) + q + (16,),
           sanitizer=sanitizer, text=text)
    return gW


# the kernel that holds an atomicAdd -> a launch of (an edited copy of) its source with two blocks on every axis
ATOMIC_LAUNCHES = {("implicit_gemm", "conv_backward_filter"): _filter_gradient}


def test_every_atomic_add_has_a_launch_of_two_blocks_per_axis():
    assert {site[:2] for site in atomic_sites()} == set(ATOMIC_LAUNCHES)


@pytest.mark.parametrize("stem,kernel,index", atomic_sites())
def test_a_plain_add_in_place_of_an_atomic_is_a_race_report(stem, kernel, index):
    # planted: the kernel's blocks add their partial sums without atomicAdd
    text = cuda.sources()[stem].read_text()
    site = list(ATOMIC_ADD.finditer(text))[index]
    broken = text[:site.start()] + f"{site['target']} += {site['value']};" + text[site.end():]
    ATOMIC_LAUNCHES[stem, kernel](text, "thread")  # clean as written
    with pytest.raises(KernelFault, match=r"(?s)ThreadSanitizer: data race.*by block \(\d,\d,\d\) thread"):
        ATOMIC_LAUNCHES[stem, kernel](broken, "thread")


def test_the_atomic_kernels_agree_with_numpy_at_two_blocks_per_axis():
    text = cuda.sources()["implicit_gemm"].read_text()
    for sanitizer in SANITIZERS:
        gW = _filter_gradient(text, sanitizer)
        x, gy = rand((2, 2, 5, 5), F), rand((2, 17, 3, 3), F, 2)
        cols = numpy.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))  # n c oy ox kh kw
        want = numpy.einsum("nohw,nchwij->ocij", gy.astype(numpy.float64), cols.astype(numpy.float64))
        numpy.testing.assert_allclose(gW, want, rtol=1e-4, atol=1e-4)


def test_an_out_of_bounds_read_is_an_address_sanitizer_report():
    # planted: im2col's bounds check lets the row below the image through
    text = cuda.sources()["im2col"].read_text()
    check = line_of(text, r"iy < height &&")
    broken = text.replace("iy < height &&", "iy <= height &&")
    x, col = rand((1, 2, 5, 5), F), numpy.zeros((2, 3, 3, 1, 5, 5), F)
    args = (x, col, col.size, 1, 2, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 5, 5)
    with pytest.raises(KernelFault) as error:
        launch("im2col", "im2col", F, (1,), (256,), args, sanitizer="address", text=broken)
    message = str(error.value)
    assert message.startswith("kernel im2col, block (0,0,0), thread (")
    assert "AddressSanitizer: heap-buffer-overflow" in message and "READ of size 4" in message
    assert "im2col at " in message and f".cu:{check + 1}" in message  # the read the check guards
    assert "0 bytes to the right of 200-byte region" in message  # x: an exact-size copy
    assert "Location: the allocation a kernel argument points into" in message


SHARED = r'''
extern "C" __global__ void static_shared(float* x) {
    __shared__ float buf[32];
    buf[threadIdx.x + 1] = x[threadIdx.x];
    __syncthreads();
    x[threadIdx.x] = buf[threadIdx.x];
}
extern "C" __global__ void dynamic_shared(float* x) {
    extern __shared__ float buf[];
    buf[threadIdx.x + 1] = x[threadIdx.x];
    __syncthreads();
    x[threadIdx.x] = buf[threadIdx.x];
}
'''


@pytest.mark.parametrize("name,where", [("static_shared", "right of __shared__ array 'buf' (line 3)"),
                                        ("dynamic_shared", "the block's dynamic shared memory")])
def test_shared_memory_overflows_are_address_sanitizer_reports(name, where):
    f = kernel_runner.compile_module(SHARED, sanitizer="address").function(name)
    with pytest.raises(KernelFault) as error:
        f.launch(1, 32, (DevicePointer.of(numpy.zeros(32, F)),), shared_mem=32 * 4)
    message = str(error.value)
    assert f"kernel {name}, block (0,0,0), thread (31,0,0): AddressSanitizer" in message
    assert "WRITE of size 4" in message and (".cu:4" in message or ".cu:10" in message)
    assert where in message


def test_the_executor_faults_come_through_the_driver(sanitizer):
    from tests.emulator.test_kernel_runner_checks import DIVERGENT
    f = kernel_runner.compile_module(DIVERGENT, ("-std=c++17",)).function("some_reach_the_barrier")
    assert kernel_runner.compile_module(DIVERGENT, ("-std=c++17",)).sanitizer == sanitizer
    with pytest.raises(KernelFault, match="is reached by 16 of the block's 32 threads"):
        f.launch(1, 32, (DevicePointer.of(numpy.zeros(32, F)),))
