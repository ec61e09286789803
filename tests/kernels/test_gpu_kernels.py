"""The CUDA kernels agree with the numpy bodies: float64 to 1e-10, float32 to 1e-4 (relative).

Each case runs one entry point on numpy and on cupy (a device, or the emulated one: tests/conftest.py) with the
same inputs.
"""
import numpy
import pytest

from layerforge.backend import to_numpy
from layerforge.kernels import batch_norm, im2col, implicit_gemm, lrn, output_size, pooling, softmax_loss

DTYPES = [numpy.float64, numpy.float32]
TOL = {numpy.float64: 1e-10, numpy.float32: 1e-4}
# (kh, kw, sy, sx, ph, pw, dy, dx)
GEOMETRIES = [(3, 3, 1, 1, 1, 1, 1, 1), (3, 2, 2, 1, 0, 1, 1, 1), (3, 3, 2, 2, 2, 2, 2, 2), (1, 1, 1, 1, 0, 0, 1, 1),
              (5, 5, 3, 2, 1, 2, 1, 1)]


def rand(shape, dtype, seed=0, low=-1.0, high=1.0):
    return numpy.random.default_rng(seed).uniform(low, high, shape).astype(dtype)


def gpu(a):
    import cupy
    return cupy.asarray(a)


def close(got, want, dtype):
    got, want = to_numpy(got), to_numpy(want)
    assert got.shape == want.shape
    scale = max(1.0, float(numpy.abs(want).max(initial=0)))
    numpy.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_im2col_col2im(dtype, geometry):
    x = rand((2, 3, 9, 8), dtype)
    col = im2col.im2col(x, *geometry)
    close(im2col.im2col(gpu(x), *geometry), col, dtype)
    gcol = rand(col.shape, dtype, 1)
    close(im2col.col2im(gpu(gcol), *geometry[2:6], 9, 8, *geometry[6:]),
          im2col.col2im(gcol, *geometry[2:6], 9, 8, *geometry[6:]), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("chunk", [4096, 32])  # 32: the filter gradient's reduction splits over many blocks
def test_implicit_gemm_conv(dtype, geometry, group, chunk, monkeypatch):
    from layerforge.kernels.cuda import implicit_gemm as gpu_conv
    monkeypatch.setattr(gpu_conv, "SPLIT_CHUNK", chunk)
    x, W, b = rand((3, 4, 9, 8), dtype), rand((6, 4 // group, *geometry[:2]), dtype, 1), rand(6, dtype, 2)
    engine = implicit_gemm.ImplicitGemmConv(geometry, group)
    out_h = im2col.conv_output_size(9, geometry[0], geometry[2], geometry[4], geometry[6])
    out_w = im2col.conv_output_size(8, geometry[1], geometry[3], geometry[5], geometry[7])
    gy = rand((3, 6, out_h, out_w), dtype, 3)
    results = []
    for move in (numpy.asarray, gpu):
        xs, Ws, bs, gys = (move(a) for a in (x, W, b, gy))
        y = move(numpy.zeros((3, 6, out_h, out_w), dtype))
        engine.forward(xs, Ws, bs, y)
        gW, gb, gx = move(numpy.ones_like(W)), move(numpy.zeros_like(b)), move(numpy.zeros_like(x))
        engine.backward(xs, Ws, gys, gW, gb, gx)  # gW starts at 1: gradients accumulate
        results.append((y, gW, gb, gx))
    for got, want in zip(results[1], results[0]):
        close(got, want, dtype)


POOL_CASES = [((3, 3), (2, 2), (1, 1)), ((2, 2), (2, 2), (0, 0)), ((3, 2), (1, 2), (1, 0)), ((3, 3), (3, 3), (0, 0))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel,stride,pad", POOL_CASES)
def test_pooling(dtype, kernel, stride, pad):
    (kh, kw), (sy, sx), (ph, pw) = kernel, stride, pad
    x = rand((2, 3, 7, 6), dtype)
    out_h = output_size.pooling_output_size(7, kh, sy, ph, padded=ph > 0 or pw > 0)
    out_w = output_size.pooling_output_size(6, kw, sx, pw, padded=ph > 0 or pw > 0)
    g = (kh, kw, sy, sx, ph, pw)
    y, argmax = pooling.max_pooling_forward(x, *g, out_h, out_w)
    y_gpu, argmax_gpu = pooling.max_pooling_forward(gpu(x), *g, out_h, out_w)
    close(y_gpu, y, dtype)
    numpy.testing.assert_array_equal(to_numpy(argmax_gpu), argmax)
    gy = rand(y.shape, dtype, 1)
    close(pooling.max_pooling_backward(gpu(gy), argmax_gpu, x.shape, *g),
          pooling.max_pooling_backward(gy, argmax, x.shape, *g), dtype)
    close(pooling.average_pooling_forward(gpu(x), *g, out_h, out_w),
          pooling.average_pooling_forward(x, *g, out_h, out_w), dtype)
    close(pooling.average_pooling_backward(gpu(gy), x.shape, *g),
          pooling.average_pooling_backward(gy, x.shape, *g), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size,beta", [(5, 0.75), (3, 0.5), (1, 1.3)])
def test_lrn(dtype, size, beta):
    x, gy = rand((2, 7, 3, 4), dtype), rand((2, 7, 3, 4), dtype, 1)
    y, scale = lrn.lrn_across_forward(x, size, 1e-1 / size, 2.0, beta)
    y_gpu, scale_gpu = lrn.lrn_across_forward(gpu(x), size, 1e-1 / size, 2.0, beta)
    close(y_gpu, y, dtype)
    close(scale_gpu, scale, dtype)
    gx = lrn.lrn_across_backward(x, scale, gy, size, 1e-1 / size, beta, numpy.empty_like(x))
    close(lrn.lrn_across_backward(gpu(x), scale_gpu, gpu(gy), size, 1e-1 / size, beta, gpu(x) * 0), gx, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore_label", [None, 2])
def test_softmax_loss(dtype, ignore_label):
    logits = rand((4, 5, 3), dtype, low=-3, high=3)
    prob = numpy.exp(logits) / numpy.exp(logits).sum(axis=1, keepdims=True)
    label = numpy.random.default_rng(1).integers(0, 5, (4, 3)).astype(dtype)
    loss, count = softmax_loss.softmax_loss_forward(prob, label, 4, 5, 3, ignore_label)
    loss_gpu, count_gpu = softmax_loss.softmax_loss_forward(gpu(prob), gpu(label), 4, 5, 3, ignore_label)
    close(loss_gpu, loss, dtype)
    assert int(count_gpu) == int(count)
    close(softmax_loss.softmax_loss_backward(gpu(prob), gpu(label), 4, 5, 3, 0.25, ignore_label),
          softmax_loss.softmax_loss_backward(prob, label, 4, 5, 3, 0.25, ignore_label), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 3, 5), (2, 6, 700), (300, 2, 1)])
def test_batch_norm(dtype, shape):
    x, gy = rand(shape, dtype, low=0, high=3), rand(shape, dtype, 1)
    centred, centred_gpu = numpy.empty_like(x), gpu(x) * 0
    mean, var = batch_norm.batch_stats(x, centred)
    mean_gpu, var_gpu = batch_norm.batch_stats(gpu(x), centred_gpu)
    close(mean_gpu, mean, dtype)
    close(var_gpu, var, dtype)
    close(centred_gpu, centred, dtype)
    inv_std = 1 / numpy.sqrt(var + 1e-5)
    y = centred * inv_std[None, :, None]
    gx = batch_norm.batch_norm_backward(gy, y, inv_std, numpy.empty_like(x))
    close(batch_norm.batch_norm_backward(gpu(gy), gpu(y), gpu(inv_std), gpu(x) * 0), gx, dtype)
