"""Each layerforge CUDA kernel on a LeNet-sized launch, run by the emulated device's kernel executor, beside the
CPU body of the same entry point.

    python benchmarks/bench_emulated_kernels.py [--repeats 3] [--threads 1,2]

The GPU launchers of layerforge/kernels/cuda/*.py run as they are (grid, block, arguments) on numpy buffers
(tests/emulator/helpers.numpy_as_cupy), float32, batch 64: LeNet's conv1 (1 -> 20, 5x5, 28x28) and
conv2 (20 -> 50, 5x5, 12x12) through im2col / col2im and the implicit-GEMM kernels, its two 2x2 max poolings,
softmax loss over 10 classes, and LRN, BatchNorm and the fused BatchNorm kernels on conv1's output. Times are
milliseconds per call, the best of ``--repeats``, with ``LAYERFORGE_EMULATED_GPU_THREADS`` host threads for
each count in ``--threads``; the first call (compilation) is not timed. "CPU ms" is the process's CPU time of the
one-thread emulated call (what it costs on a machine shared with other work, where wall times swell).
"""
import argparse
import os
import sys
import time

import numpy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from layerforge.kernels import batch_norm, fused_batch_norm, im2col, implicit_gemm, lrn, pooling  # noqa: E402
from layerforge.kernels import softmax_loss  # noqa: E402
from layerforge.kernels.cuda import batch_norm as gpu_bn  # noqa: E402
from layerforge.kernels.cuda import fused_batch_norm as gpu_fused  # noqa: E402
from layerforge.kernels.cuda import im2col as gpu_im2col  # noqa: E402
from layerforge.kernels.cuda import implicit_gemm as gpu_conv  # noqa: E402
from layerforge.kernels.cuda import lrn as gpu_lrn  # noqa: E402
from layerforge.kernels.cuda import pooling as gpu_pool  # noqa: E402
from layerforge.kernels.cuda import softmax_loss as gpu_softmax  # noqa: E402
from tests.emulator.helpers import numpy_as_cupy, rand  # noqa: E402

F = numpy.float32
CONV = (5, 5, 1, 1, 0, 0, 1, 1)
POOL = (2, 2, 2, 2, 0, 0)


def cases():
    """``[(name, emulated call, CPU call)]``: each kernel's launch at LeNet's sizes."""
    x1, x2 = rand((64, 1, 28, 28), F), rand((64, 20, 12, 12), F, 1)
    w1, w2 = rand((20, 1, 5, 5), F, 2), rand((50, 20, 5, 5), F, 3)
    y1, y2 = numpy.zeros((64, 20, 24, 24), F), numpy.zeros((64, 50, 8, 8), F)
    gy2 = rand(y2.shape, F, 4)
    col2 = im2col.im2col_cpu(x2, *CONV)
    engine2 = implicit_gemm.ImplicitGemmConv(CONV, 1)
    gw, gx = numpy.zeros_like(w2), numpy.zeros_like(x2)
    p1 = rand((64, 20, 24, 24), F, 5)
    py1, argmax1 = pooling.max_pooling_forward(p1, *POOL, 12, 12)
    p2 = rand((64, 50, 8, 8), F, 6)
    py2, argmax2 = pooling.max_pooling_forward(p2, *POOL, 4, 4)
    argmax1_gpu, argmax2_gpu = argmax1.astype(numpy.int32), argmax2.astype(numpy.int32)
    logits = rand((64, 10, 1), F, 7, -3, 3)
    prob = numpy.exp(logits) / numpy.exp(logits).sum(axis=1, keepdims=True)
    label = numpy.random.default_rng(8).integers(0, 10, 64).astype(F)
    s = p1.reshape(64, 20, -1)
    mean, var = batch_norm.batch_stats(s)
    inv_std = (1 / numpy.sqrt(var + 1e-5)).astype(F)
    gamma, beta = rand(20, F, 9, 0.5, 1.5), rand(20, F, 10)
    xn = numpy.empty_like(s)
    batch_norm.normalize(s, mean, inv_std, xn)
    _, scale = lrn.lrn_across_forward(p1, 5, 1e-4 / 5, 1.0, 0.75)
    return [
        ("im2col conv1 (921,600 columns)", lambda: gpu_im2col.im2col_gpu(x1, *CONV),
         lambda: im2col.im2col_cpu(x1, *CONV)),
        ("im2col conv2 (2,048,000)", lambda: gpu_im2col.im2col_gpu(x2, *CONV), lambda: im2col.im2col_cpu(x2, *CONV)),
        ("col2im conv2 (184,320)", lambda: gpu_im2col.col2im_gpu(col2, 1, 1, 0, 0, 12, 12),
         lambda: im2col.col2im_cpu(col2, 1, 1, 0, 0, 12, 12)),
        ("implicit GEMM forward conv1", lambda: gpu_conv.conv_forward_gpu(x1, w1, None, y1, CONV, 1),
         lambda: implicit_gemm.ImplicitGemmConv(CONV, 1).forward(x1, w1, None, y1)),
        ("implicit GEMM forward conv2", lambda: gpu_conv.conv_forward_gpu(x2, w2, None, y2, CONV, 1),
         lambda: engine2.forward(x2, w2, None, y2)),
        ("implicit GEMM data gradient conv2", lambda: gpu_conv.conv_backward_gpu(x2, w2, gy2, None, None, gx, CONV, 1),
         lambda: engine2.backward(x2, w2, gy2, None, None, gx)),
        ("implicit GEMM filter gradient conv2", lambda: gpu_conv.conv_backward_gpu(x2, w2, gy2, gw, None, None, CONV, 1),
         lambda: engine2.backward(x2, w2, gy2, gw, None, None)),
        ("max pool1 forward", lambda: gpu_pool.max_pooling_forward_gpu(p1, *POOL, 12, 12),
         lambda: pooling.max_pooling_forward(p1, *POOL, 12, 12)),
        ("max pool1 backward", lambda: gpu_pool.max_pooling_backward_gpu(py1, argmax1_gpu, p1.shape, *POOL),
         lambda: pooling.max_pooling_backward(py1, argmax1, p1.shape, *POOL)),
        ("max pool2 forward", lambda: gpu_pool.max_pooling_forward_gpu(p2, *POOL, 4, 4),
         lambda: pooling.max_pooling_forward(p2, *POOL, 4, 4)),
        ("max pool2 backward", lambda: gpu_pool.max_pooling_backward_gpu(py2, argmax2_gpu, p2.shape, *POOL),
         lambda: pooling.max_pooling_backward(py2, argmax2, p2.shape, *POOL)),
        ("ave pool1 forward", lambda: gpu_pool.average_pooling_forward_gpu(p1, *POOL, 12, 12),
         lambda: pooling.average_pooling_forward(p1, *POOL, 12, 12)),
        ("softmax loss forward", lambda: gpu_softmax.softmax_loss_forward_gpu(prob, label, 64, 10, 1),
         lambda: softmax_loss.softmax_loss_forward(prob, label, 64, 10, 1)),
        ("softmax loss backward", lambda: gpu_softmax.softmax_loss_backward_gpu(prob, label, 64, 10, 1, 1 / 64),
         lambda: softmax_loss.softmax_loss_backward(prob, label, 64, 10, 1, 1 / 64)),
        ("LRN forward (64, 20, 24, 24)", lambda: gpu_lrn.lrn_forward_gpu(p1, 5, 1e-4 / 5, 1.0, 0.75),
         lambda: lrn.lrn_across_forward(p1, 5, 1e-4 / 5, 1.0, 0.75)),
        ("LRN backward", lambda: gpu_lrn.lrn_backward_gpu(p1, scale, p1, 5, 1e-4 / 5, 0.75, numpy.empty_like(p1)),
         lambda: lrn.lrn_across_backward(p1, scale, p1, 5, 1e-4 / 5, 0.75, numpy.empty_like(p1))),
        ("BatchNorm statistics", lambda: gpu_bn.batch_stats_gpu(s), lambda: batch_norm.batch_stats(s)),
        ("BatchNorm backward", lambda: gpu_bn.batch_norm_backward_gpu(s, xn, inv_std, numpy.empty_like(s)),
         lambda: batch_norm.batch_norm_backward(s, xn, inv_std, numpy.empty_like(s))),
        ("fused BN scale-shift-ReLU", lambda: gpu_fused.scale_shift_relu_gpu(xn, gamma, beta, 0.0, numpy.empty_like(s)),
         lambda: fused_batch_norm.scale_shift_relu(xn, gamma, beta, 0.0, numpy.empty_like(s))),
        ("fused BN gradient sums", lambda: gpu_fused.grad_sums_gpu(s, s, xn, 0.0),
         lambda: batch_norm.grad_sums(s, s, 0.0, xn)),
    ]


def best_ms(call, repeats, clock=time.perf_counter):
    times = []
    for _ in range(repeats):
        t = clock()
        call()
        times.append(clock() - t)
    return 1000 * min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="1,2", help="host thread counts for the emulated launches")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    table = cases()
    with numpy_as_cupy():
        for _, emulated, _ in table:
            emulated()  # compile
    head = "".join(f"{f'emulated, {t} thr':>18}" for t in threads)
    print(f"{'kernel (LeNet-sized, float32, ms per call)':40}{head}{'CPU ms, 1 thr':>15}{'CPU body':>10}")
    for name, emulated, cpu in table:
        row = []
        for t in threads:
            os.environ["LAYERFORGE_EMULATED_GPU_THREADS"] = str(t)
            with numpy_as_cupy():
                row.append(best_ms(emulated, args.repeats))
        os.environ["LAYERFORGE_EMULATED_GPU_THREADS"] = "1"
        with numpy_as_cupy():
            cpu_time = best_ms(emulated, args.repeats, time.process_time)
        cpu_ms = best_ms(cpu, args.repeats)
        print(f"{name:40}" + "".join(f"{ms:18.2f}" for ms in row) + f"{cpu_time:15.2f}{cpu_ms:10.2f}")


if __name__ == "__main__":
    main()
