"""layerforge.kernels.cuda's device-free parts: sources, dtype defines, launch shapes, kernel argument types."""
import sys

import numpy
import pytest

from layerforge.kernels import cuda


def test_sources_and_defines():
    assert set(cuda.sources()) == {"im2col", "implicit_gemm", "pooling", "lrn", "softmax_loss", "batch_norm",
                                   "fused_batch_norm"}
    assert cuda.defines(numpy.float32) == ("-DLF_REAL=float",)
    assert cuda.defines("float64") == ("-DLF_REAL=double",)
    with pytest.raises(KeyError):
        cuda.defines(numpy.int32)
    for path in cuda.sources().values():  # every source instantiates through the one define
        assert "typedef LF_REAL T;" in path.read_text()


@pytest.mark.parametrize("n,want", [(1, 1), (256, 1), (257, 2), (10 ** 9, cuda.MAX_BLOCKS)])
def test_blocks(n, want):
    assert cuda.blocks(n) == want


def test_kernel_args_are_c_ints():
    # cupy would pass a Python int as long long and a float as double: the kernels declare int and T
    x = numpy.zeros(3)
    args = cuda.kernel_args((x, 7, numpy.float32(0.5), numpy.int32(2)))
    assert args[0] is x and type(args[1]) is numpy.int32 and args[1] == 7
    assert type(args[2]) is numpy.float32 and type(args[3]) is numpy.int32
    with pytest.raises(TypeError, match="numpy scalars"):
        cuda.kernel_args((0.5,))
    with pytest.raises(OverflowError):
        cuda.kernel_args((2 ** 31,))


def test_importing_the_kernels_does_not_import_cupy():
    import subprocess
    code = ("import sys, layerforge.kernels.cuda, layerforge.kernels.cuda.implicit_gemm, "
            "layerforge.kernels.cuda.pooling, layerforge.kernels.lrn, layerforge.kernels.batch_norm, "
            "layerforge.kernels.softmax_loss, layerforge.kernels.fused_batch_norm, layerforge.kernels.cuda.fused_batch_norm; "
            "print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- every launcher passes what its kernel declares (a fake cupy records the launches) -----------------

def _signatures():
    """``{(stem, kernel): [param type, ...]}`` from the ``extern "C"`` declarations of every source."""
    import re
    sigs = {}
    for stem, path in cuda.sources().items():
        text = path.read_text()
        macro = re.search(r"#define GEOMETRY_PARAMS (.*?\n.*?)\n", text)
        if macro:
            text = text.replace("GEOMETRY_PARAMS,", macro.group(1).replace("\\\n", " ") + ",")
            text = text.replace("GEOMETRY_PARAMS)", macro.group(1).replace("\\\n", " ") + ")")
        for name, params in re.findall(r'extern "C" __global__ void (\w+)\((.*?)\)\s*\{', text, re.S):
            kinds = []
            for p in params.split(","):
                p = p.replace("__restrict__", "").replace("const", "").split()
                kinds.append(("int*" if p[0].rstrip("*") == "int" else "T*") if "*" in "".join(p) else p[0])
            sigs[stem, name] = kinds
    return sigs


class _FakeCupy:
    """Just enough of cupy for the launchers, on numpy arrays; RawModule records each launch."""

    def __init__(self):
        self.launches = []
        self.ndarray = type("NotAnArray", (), {})

    def __getattr__(self, name):
        return getattr(numpy, name)

    def RawModule(self, code, options):  # noqa: N802 - cupy's name
        fake = self

        class Module:
            def get_function(self, name):
                return lambda grid, block, args, shared_mem=0: fake.launches.append((name, options, grid, block, args))
        return Module()


@pytest.fixture
def fake_cupy(monkeypatch):
    fake = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    cuda._module.cache_clear()
    yield fake
    cuda._module.cache_clear()


def _check(fake, dtype):
    sigs = {name: kinds for (stem, name), kinds in _signatures().items()}
    assert fake.launches
    for name, options, grid, block, args in fake.launches:
        assert f"-DLF_REAL={cuda.CTYPES[numpy.dtype(dtype)]}" in options
        kinds = sigs[name]
        assert len(args) == len(kinds), (name, len(args), len(kinds))
        for i, (a, kind) in enumerate(zip(args, kinds)):
            want = {"int": numpy.int32, "T": numpy.dtype(dtype).type}.get(kind)
            if want is not None:
                assert type(a) is want, (name, i, type(a), kind)
            else:
                assert isinstance(a, numpy.ndarray) and a.flags.c_contiguous, (name, i)
                assert a.dtype == (numpy.int32 if kind == "int*" else dtype), (name, i, a.dtype, kind)
        assert all(isinstance(v, int) and v >= 1 for v in (*grid, *block))
    fake.launches.clear()


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_launchers_match_kernel_signatures(fake_cupy, dtype):
    from layerforge.kernels.cuda import batch_norm, fused_batch_norm, im2col, implicit_gemm, lrn, pooling, softmax_loss
    x = numpy.ones((2, 4, 6, 5), dtype)
    col = im2col.im2col_gpu(x, 3, 3, 1, 1, 1, 1)
    im2col.col2im_gpu(col, 1, 1, 1, 1, 6, 5)
    W, b = numpy.ones((6, 2, 3, 3), dtype), numpy.ones(6, dtype)
    y = numpy.zeros((2, 6, 6, 5), dtype)
    implicit_gemm.conv_forward_gpu(x, W, b, y, (3, 3, 1, 1, 1, 1, 1, 1), 2)
    implicit_gemm.conv_backward_gpu(x, W, y, numpy.zeros_like(W), numpy.zeros_like(b), numpy.zeros_like(x),
                                    (3, 3, 1, 1, 1, 1, 1, 1), 2)
    yp, argmax = pooling.max_pooling_forward_gpu(x, 2, 2, 2, 2, 0, 0, 3, 3)
    pooling.max_pooling_backward_gpu(yp, argmax, x.shape, 2, 2, 2, 2, 0, 0)
    pooling.average_pooling_forward_gpu(x, 2, 2, 2, 2, 0, 0, 3, 3)
    pooling.average_pooling_backward_gpu(yp, x.shape, 2, 2, 2, 2, 0, 0)
    _, scale = lrn.lrn_forward_gpu(x, 3, 0.1, 1.0, 0.75)
    lrn.lrn_backward_gpu(x, scale, x, 3, 0.1, 0.75, numpy.empty_like(x))
    prob, label = numpy.full((2, 4, 30), 0.25, dtype), numpy.zeros((2, 30))
    softmax_loss.softmax_loss_forward_gpu(prob, label, 2, 4, 30, ignore_label=3)
    softmax_loss.softmax_loss_backward_gpu(prob, label, 2, 4, 30, 0.5)
    x3 = x.reshape(2, 4, 30)
    batch_norm.batch_stats_gpu(x3, numpy.empty_like(x3))
    batch_norm.batch_norm_backward_gpu(x3, x3, numpy.ones(4, dtype), numpy.empty_like(x3))
    c4 = numpy.ones(4, dtype)
    for slope in (None, 0.0, 0.1):  # no ReLU, ReLU, leaky ReLU: the relu flag and slope as the kernel takes them
        fused_batch_norm.scale_shift_relu_gpu(x3, c4, c4, slope, numpy.empty_like(x3))
        fused_batch_norm.grad_sums_gpu(x3, x3, x3, slope)
        fused_batch_norm.fused_backward_gpu(x3, x3, x3, c4, c4, c4, slope, numpy.empty_like(x3))
    names = {launch[0] for launch in fake_cupy.launches}
    assert names == {kernel for _, kernel in _signatures()}  # every kernel launched at least once
    _check(fake_cupy, dtype)


def test_filter_gradient_split():
    from layerforge.kernels.cuda.implicit_gemm import MAX_GRID_Z, SPLIT_CHUNK, TILE, split_chunk
    assert SPLIT_CHUNK % TILE == 0
    assert split_chunk(100, 1) == SPLIT_CHUNK
    big = SPLIT_CHUNK * MAX_GRID_Z * 3  # too many splits for the grid's z: the chunk doubles until it fits
    chunk = split_chunk(big, 2)
    assert chunk % SPLIT_CHUNK == 0 and 2 * -(-big // chunk) <= MAX_GRID_Z < 2 * -(-big // (chunk // 2))
