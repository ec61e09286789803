"""The threaded non-GEMM kernels (kernels.threadpool) at 1 and 2 threads, next to PyTorch's same op.

    python benchmarks/bench_ops.py [--repeat 5] [--threads 1,2]

Ops and shapes from AlexNet b16 and ResNet-50 b8 (the hot non-GEMM layers of `layerforge time`):
im2col / col2im (against torch's unfold / fold), max and average pooling forward and backward (against
torch's max_pool2d / avg_pool2d and their autograd), and the fused BatchNorm + Scale + ReLU of a ResNet-50
block (batch statistics; against torch's relu(batch_norm(x, weight, bias)) and its autograd). Each figure is the minimum of ``--repeat`` runs after
a warm-up, in milliseconds; ``speed-up`` is layerforge 1 thread / layerforge N threads. The torch columns
use torch.set_num_threads(N).
"""
import argparse
import os
import sys

import numpy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_conv import best_time  # noqa: E402

from layerforge.kernels import threadpool as parallel, pooling  # noqa: E402
from layerforge.kernels.batch_norm import batch_stats, normalize  # noqa: E402
from layerforge.kernels.fused_batch_norm import bn_scale_relu_backward, scale_shift_relu  # noqa: E402
from layerforge.kernels.im2col import col2im_cpu, im2col_cpu  # noqa: E402
from layerforge.kernels.output_size import conv_output_size  # noqa: E402

# (name, N, C, H, W, kernel, stride, pad)
IM2COL = [("alexnet conv2 b16", 16, 96, 27, 27, 5, 1, 2), ("resnet50 3x3 56 b8", 8, 64, 56, 56, 3, 1, 1),
          ("resnet50 3x3 14 b8", 8, 256, 14, 14, 3, 1, 1)]
POOL = [("alexnet pool1 b16", "max", 16, 96, 55, 55, 3, 2, 0), ("resnet50 pool1 b8", "max", 8, 64, 112, 112, 3, 2, 1),
        ("resnet50 avgpool b8", "ave", 8, 2048, 7, 7, 7, 1, 0)]
BATCH_NORM = [("resnet50 res2 b8", 8, 256, 56, 56), ("resnet50 res4 b8", 8, 1024, 14, 14)]


def best_ms(fn, repeat):
    return 1000 * best_time(fn, repeat)


def pool_size(h, k, s, p):
    out = -(-(h + 2 * p - k) // s) + 1
    return out - 1 if p and (out - 1) * s >= h + p else out


def cases():
    rng = numpy.random.RandomState(0)
    for name, n, c, h, w, k, s, p in IM2COL:
        x = rng.randn(n, c, h, w).astype(numpy.float32)
        oh, ow = conv_output_size(h, k, s, p), conv_output_size(w, k, s, p)
        col = im2col_cpu(x, k, k, s, s, p, p)
        yield (f"im2col {name}", lambda x=x, k=k, s=s, p=p: im2col_cpu(x, k, k, s, s, p, p),
               ("unfold", x, dict(kernel_size=k, stride=s, padding=p)))
        yield (f"col2im {name}", lambda col=col, s=s, p=p, h=h, w=w: col2im_cpu(col, s, s, p, p, h, w),
               ("fold", col.reshape(c * k * k, n, oh * ow).transpose(1, 0, 2).copy(),
                dict(output_size=(h, w), kernel_size=k, stride=s, padding=p)))
    for name, kind, n, c, h, w, k, s, p in POOL:
        x = rng.randn(n, c, h, w).astype(numpy.float32)
        oh, ow = pool_size(h, k, s, p), pool_size(w, k, s, p)
        gy = rng.randn(n, c, oh, ow).astype(numpy.float32)
        if kind == "max":
            y, argmax = pooling.max_pooling_forward(x, k, k, s, s, p, p, oh, ow)
            yield (f"maxpool fwd {name}", lambda x=x, k=k, s=s, p=p, oh=oh, ow=ow:
                   pooling.max_pooling_forward(x, k, k, s, s, p, p, oh, ow), ("max_pool2d", x, dict(
                       kernel_size=k, stride=s, padding=p, ceil_mode=True)))
            yield (f"maxpool bwd {name}", lambda gy=gy, a=argmax, shape=x.shape, k=k, s=s, p=p:
                   pooling.max_pooling_backward(gy, a, shape, k, k, s, s, p, p), ("max_pool2d_backward", x, dict(
                       kernel_size=k, stride=s, padding=p, ceil_mode=True)))
        else:
            yield (f"avgpool fwd {name}", lambda x=x, k=k, s=s, p=p, oh=oh, ow=ow:
                   pooling.average_pooling_forward(x, k, k, s, s, p, p, oh, ow), ("avg_pool2d", x, dict(
                       kernel_size=k, stride=s, padding=p, ceil_mode=True)))
            yield (f"avgpool bwd {name}", lambda gy=gy, shape=x.shape, k=k, s=s, p=p:
                   pooling.average_pooling_backward(gy, shape, k, k, s, s, p, p), ("avg_pool2d_backward", x, dict(
                       kernel_size=k, stride=s, padding=p, ceil_mode=True)))
    yield from batch_norm_cases(rng)


def batch_norm_cases(rng):
    for name, n, c, h, w in BATCH_NORM:
        x = rng.randn(n, c, h * w).astype(numpy.float32) * 2 + 1
        gamma, beta = rng.rand(c).astype(numpy.float32) + 0.5, rng.randn(c).astype(numpy.float32)
        x_norm, y = numpy.empty_like(x), numpy.empty_like(x)

        def forward(x=x, gamma=gamma, beta=beta, x_norm=x_norm, y=y):
            mean, var = batch_stats(x)
            inv_std = 1 / numpy.sqrt(var + 1e-5)
            normalize(x, mean, inv_std, x_norm)
            scale_shift_relu(x_norm, gamma, beta, 0.0, y)
            return inv_std
        inv_std = forward()
        gy, gx = rng.randn(*x.shape).astype(numpy.float32), numpy.empty_like(x)
        g_gamma, g_beta = numpy.zeros_like(gamma), numpy.zeros_like(beta)
        spec = (x.reshape(n, c, h, w), dict(weight=gamma, bias=beta))
        yield f"bn+scale+relu fwd {name}", forward, ("batch_norm_relu",) + spec
        yield (f"bn+scale+relu bwd {name}", lambda: bn_scale_relu_backward(gy, y, x_norm, inv_std, gamma, 0.0, True,
                                                                           g_gamma, g_beta, gx),
               ("batch_norm_relu_backward",) + spec)


def batch_norm_relu(t, weight, bias):
    import torch
    import torch.nn.functional as F
    return F.relu(F.batch_norm(t, None, None, torch.from_numpy(weight), torch.from_numpy(bias), training=True))


def torch_fn(spec):
    import torch
    import torch.nn.functional as F

    op, x, kwargs = spec
    t = torch.from_numpy(x)
    ops = {"batch_norm_relu": batch_norm_relu}
    if op.endswith("_backward"):
        t = t.clone().requires_grad_(True)
        base = op[:-len("_backward")]
        y = ops[base](t, **kwargs) if base in ops else getattr(F, base)(t, **kwargs)
        g = torch.randn_like(y)
        return lambda: torch.autograd.grad(y, t, g, retain_graph=True)
    return lambda: ops[op](t, **kwargs) if op in ops else getattr(F, op)(t, **kwargs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    import torch

    load = os.getloadavg()[0]
    print(f"# {os.cpu_count()} cores, load {load:.2f}; minimum of {args.repeat} runs, ms")
    header = " | ".join([f"layerforge {t}t" for t in counts] + [f"torch {t}t" for t in counts])
    print(f"| op | {header} | speed-up {counts[-1]}t |")
    print("|---|" + "---:|" * (2 * len(counts) + 1))
    for name, fn, spec in cases():
        ours, theirs = [], []
        for t in counts:
            parallel.set_num_threads(t)
            ours.append(best_ms(fn, args.repeat))
            torch.set_num_threads(t)
            theirs.append(best_ms(torch_fn(spec), args.repeat))
        cells = " | ".join(f"{v:.2f}" for v in ours + theirs)
        print(f"| {name} | {cells} | {ours[0] / ours[-1]:.2f}x |")


if __name__ == "__main__":
    main()
