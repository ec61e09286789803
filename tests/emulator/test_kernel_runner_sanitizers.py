"""The kernels under ThreadSanitizer and AddressSanitizer (``LAYERFORGE_EMULATED_GPU_SANITIZER``): layerforge's
own kernels run clean and still agree with the CPU bodies; planted races and out-of-bounds accesses are reported
as a KernelFault naming kernel, GPU thread, access and source line.

Small shapes and float32 only: each sanitized launch is a process of its own (about 0.1 s), and each source is
built once per sanitizer (about 1 s here).
"""
import numpy
import pytest

from layerforge.kernels import cuda
from layerforge.kernels.cuda import implicit_gemm as gpu_conv
from layerforge_emulator import kernel_runner
from layerforge_emulator.kernel_runner import DevicePointer, KernelFault
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
    "implicit_gemm": lambda: kernels.check_implicit_gemm_conv(F, (3, 3, 1, 1, 1, 1, 1, 1), 1, (1, 2, 5, 5), 3),
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
    with numpy_as_cupy():
        CASES[stem]()


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
    # the tile's store and the read of another thread's element, with their lines in implicit_gemm.cu
    assert "tiled_product at " in message and ".cu:76" in message and ".cu:78" in message


def test_plain_adds_in_place_of_atomics_race_between_blocks():
    # planted: the filter gradient's blocks add their partial sums into gW without atomicAdd
    text = cuda.sources()["implicit_gemm"].read_text()
    broken = text.replace("atomicAdd(&gw[(long long)(g * m + row) * k_total + col], acc);",
                          "gw[(long long)(g * m + row) * k_total + col] += acc;")
    assert broken != text
    x, W, gy = rand((1, 1, 4, 4), F), rand((2, 1, 3, 3), F, 1), rand((1, 2, 2, 2), F, 2)
    gW = numpy.zeros_like(W)
    q = gpu_conv._geometry(x.shape, W.shape, (3, 3, 1, 1, 0, 0, 1, 1), 1)
    # the reduction over 4 positions in chunks of 2: blocks z = 0 and 1 add into every element of gW
    launch("implicit_gemm", "conv_backward_filter", F, (1, 1, 2), (16, 16), (x, gy, gW) + q + (2,), sanitizer="thread")
    with pytest.raises(KernelFault, match=r"(?s)ThreadSanitizer: data race.*by block \(0,0,[01]\) thread"):
        launch("implicit_gemm", "conv_backward_filter", F, (1, 1, 2), (16, 16), (x, gy, gW) + q + (2,),
               sanitizer="thread", text=broken)


def test_an_out_of_bounds_read_is_an_address_sanitizer_report():
    # planted: im2col's bounds check lets the row below the image through
    text = cuda.sources()["im2col"].read_text()
    broken = text.replace("iy < height &&", "iy <= height &&")
    assert broken != text
    x, col = rand((1, 2, 5, 5), F), numpy.zeros((2, 3, 3, 1, 5, 5), F)
    args = (x, col, col.size, 1, 2, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 5, 5)
    with pytest.raises(KernelFault) as error:
        launch("im2col", "im2col", F, (1,), (256,), args, sanitizer="address", text=broken)
    message = str(error.value)
    assert message.startswith("kernel im2col, block (0,0,0), thread (")
    assert "AddressSanitizer: heap-buffer-overflow" in message and "READ of size 4" in message
    assert "im2col at " in message and ".cu:22" in message
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
