"""layerforge's own .cu kernels, compiled with g++ and run by the emulated device's kernel executor, agree with
the CPU bodies of the same entry points: float64 to 1e-10, float32 to 1e-4 (relative).

Each case runs a GPU launcher of layerforge/kernels/cuda/*.py as it is (its grid, block and argument list) on
numpy buffers (helpers.numpy_as_cupy), and the entry point's CPU body on the same inputs.
"""
import numpy
import pytest

from layerforge.kernels import batch_norm, fused_batch_norm, im2col, implicit_gemm, lrn, pooling, softmax_loss
from layerforge.kernels.output_size import conv_output_size, pooling_output_size
from layerforge.kernels.cuda import batch_norm as gpu_batch_norm
from layerforge.kernels.cuda import fused_batch_norm as gpu_fused
from layerforge.kernels.cuda import im2col as gpu_im2col
from layerforge.kernels.cuda import implicit_gemm as gpu_conv
from layerforge.kernels.cuda import lrn as gpu_lrn
from layerforge.kernels.cuda import pooling as gpu_pooling
from layerforge.kernels.cuda import softmax_loss as gpu_softmax_loss
from tests.emulator.helpers import DTYPES, close, numpy_as_cupy, rand

# (kh, kw, sy, sx, ph, pw, dy, dx)
GEOMETRIES = [(3, 3, 1, 1, 1, 1, 1, 1), (3, 2, 2, 1, 0, 1, 1, 1), (3, 3, 2, 2, 2, 2, 2, 2), (1, 1, 1, 1, 0, 0, 1, 1)]

pytestmark = pytest.mark.usefixtures("built_kernels")


@pytest.fixture(autouse=True)
def _emulated_launchers():
    with numpy_as_cupy():
        yield


def test_the_references_are_the_cpu_bodies():
    # numpy arrays still go to the CPU bodies while the launchers run emulated
    from layerforge.backend import get_array_module
    assert get_array_module(numpy.zeros(1)) is numpy


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_im2col_col2im(dtype, geometry):
    x = rand((2, 3, 9, 8), dtype)
    col = im2col.im2col_cpu(x, *geometry)
    close(gpu_im2col.im2col_gpu(x, *geometry), col, dtype)
    gcol = rand(col.shape, dtype, 1)
    close(gpu_im2col.col2im_gpu(gcol, *geometry[2:6], 9, 8, *geometry[6:]),
          im2col.col2im_cpu(gcol, *geometry[2:6], 9, 8, *geometry[6:]), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("group,chunk", [(1, 4096), (2, 32)])  # 32: gW's reduction split over many blocks
def test_implicit_gemm_conv(dtype, geometry, group, chunk, monkeypatch):
    monkeypatch.setattr(gpu_conv, "SPLIT_CHUNK", chunk)
    check_implicit_gemm_conv(dtype, geometry, group, (3, 4, 9, 8), 6)


def check_implicit_gemm_conv(dtype, geometry, group, x_shape, cout):
    """Forward and backward of the implicit-GEMM kernels against the IMPLICIT engine's CPU body."""
    x, W, b = rand(x_shape, dtype), rand((cout, x_shape[1] // group, *geometry[:2]), dtype, 1), rand(cout, dtype, 2)
    engine = implicit_gemm.ImplicitGemmConv(geometry, group)
    out_h = conv_output_size(x_shape[2], geometry[0], geometry[2], geometry[4], geometry[6])
    out_w = conv_output_size(x_shape[3], geometry[1], geometry[3], geometry[5], geometry[7])
    gy = rand((x_shape[0], cout, out_h, out_w), dtype, 3)
    y = numpy.zeros(gy.shape, dtype)
    engine.forward(x, W, b, y)
    gW, gb, gx = numpy.ones_like(W), numpy.zeros_like(b), numpy.zeros_like(x)
    engine.backward(x, W, gy, gW, gb, gx)  # gW starts at 1: gradients accumulate
    y_e = numpy.zeros_like(y)
    gpu_conv.conv_forward_gpu(x, W, b, y_e, geometry, group)
    gW_e, gb_e, gx_e = numpy.ones_like(W), numpy.zeros_like(b), numpy.zeros_like(x)
    gpu_conv.conv_backward_gpu(x, W, gy, gW_e, gb_e, gx_e, geometry, group)
    for got, want in ((y_e, y), (gW_e, gW), (gb_e, gb), (gx_e, gx)):
        close(got, want, dtype)


POOL_CASES = [((3, 3), (2, 2), (1, 1)), ((2, 2), (2, 2), (0, 0)), ((3, 2), (1, 2), (1, 0))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel,stride,pad", POOL_CASES)
def test_pooling(dtype, kernel, stride, pad):
    (kh, kw), (sy, sx), (ph, pw) = kernel, stride, pad
    x = rand((2, 3, 7, 6), dtype)
    out_h = pooling_output_size(7, kh, sy, ph, padded=ph > 0 or pw > 0)
    out_w = pooling_output_size(6, kw, sx, pw, padded=ph > 0 or pw > 0)
    g = (kh, kw, sy, sx, ph, pw)
    y, argmax = pooling.max_pooling_forward(x, *g, out_h, out_w)
    y_e, argmax_e = gpu_pooling.max_pooling_forward_gpu(x, *g, out_h, out_w)
    close(y_e, y, dtype)
    numpy.testing.assert_array_equal(argmax_e, argmax)
    gy = rand(y.shape, dtype, 1)
    close(gpu_pooling.max_pooling_backward_gpu(gy, argmax_e, x.shape, *g),
          pooling.max_pooling_backward(gy, argmax, x.shape, *g), dtype)
    close(gpu_pooling.average_pooling_forward_gpu(x, *g, out_h, out_w),
          pooling.average_pooling_forward(x, *g, out_h, out_w), dtype)
    close(gpu_pooling.average_pooling_backward_gpu(gy, x.shape, *g),
          pooling.average_pooling_backward(gy, x.shape, *g), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size,beta", [(5, 0.75), (1, 1.3)])
def test_lrn(dtype, size, beta):
    x, gy = rand((2, 7, 3, 4), dtype), rand((2, 7, 3, 4), dtype, 1)
    y, scale = lrn.lrn_across_forward(x, size, 1e-1 / size, 2.0, beta)
    y_e, scale_e = gpu_lrn.lrn_forward_gpu(x, size, 1e-1 / size, 2.0, beta)
    close(y_e, y, dtype)
    close(scale_e, scale, dtype)
    gx = lrn.lrn_across_backward(x, scale, gy, size, 1e-1 / size, beta, numpy.empty_like(x))
    close(gpu_lrn.lrn_backward_gpu(x, scale_e, gy, size, 1e-1 / size, beta, numpy.zeros_like(x)), gx, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore_label", [None, 2])
def test_softmax_loss(dtype, ignore_label):
    logits = rand((4, 5, 3), dtype, low=-3, high=3)
    prob = numpy.exp(logits) / numpy.exp(logits).sum(axis=1, keepdims=True)
    label = numpy.random.default_rng(1).integers(0, 5, (4, 3)).astype(dtype)
    loss, count = softmax_loss.softmax_loss_forward(prob, label, 4, 5, 3, ignore_label)
    loss_e, count_e = gpu_softmax_loss.softmax_loss_forward_gpu(prob, label, 4, 5, 3, ignore_label)
    close(loss_e, loss, dtype)
    assert int(count_e) == int(count)
    close(gpu_softmax_loss.softmax_loss_backward_gpu(prob, label, 4, 5, 3, 0.25, ignore_label),
          softmax_loss.softmax_loss_backward(prob, label, 4, 5, 3, 0.25, ignore_label), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 3, 5), (2, 6, 700), (300, 2, 1)])
def test_batch_norm(dtype, shape):
    x, gy = rand(shape, dtype, low=0, high=3), rand(shape, dtype, 1)
    centred, centred_e = numpy.empty_like(x), numpy.zeros_like(x)
    mean, var = batch_norm.batch_stats(x, centred)
    mean_e, var_e = gpu_batch_norm.batch_stats_gpu(x, centred_e)
    close(mean_e, mean, dtype)
    close(var_e, var, dtype)
    close(centred_e, centred, dtype)
    inv_std = (1 / numpy.sqrt(var + 1e-5)).astype(dtype)
    y = centred * inv_std[None, :, None]
    gx = batch_norm.batch_norm_backward(gy, y, inv_std, numpy.empty_like(x))
    close(gpu_batch_norm.batch_norm_backward_gpu(gy, y, inv_std, numpy.zeros_like(x)), gx, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 3, 5), (2, 5, 300)])
@pytest.mark.parametrize("negative_slope", [None, 0.0, 0.1])
def test_fused_batch_norm(dtype, shape, negative_slope):
    x_norm, gy = rand(shape, dtype), rand(shape, dtype, 1)
    c = shape[1]
    gamma, beta = rand(c, dtype, 2, 0.5, 1.5), rand(c, dtype, 3)
    y = fused_batch_norm.scale_shift_relu(x_norm, gamma, beta, negative_slope, numpy.empty_like(x_norm))
    close(gpu_fused.scale_shift_relu_gpu(x_norm, gamma, beta, negative_slope, numpy.zeros_like(x_norm)), y, dtype)
    sums = batch_norm.grad_sums(gy, y, negative_slope, x_norm)
    sums_e = gpu_fused.grad_sums_gpu(gy, y, x_norm, negative_slope)
    for got, want in zip(sums_e, sums):
        close(got, want, dtype)
    coefs = [rand(c, dtype, seed) for seed in (4, 5, 6)]
    gx = batch_norm.input_grad(gy, y, negative_slope, x_norm, *coefs, numpy.empty_like(gy))
    close(gpu_fused.fused_backward_gpu(gy, y, x_norm, *coefs, negative_slope, numpy.zeros_like(gy)), gx, dtype)
