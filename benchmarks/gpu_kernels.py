"""Every CUDA kernel of layerforge, and cuBLAS's product in each precision, on fixed inputs: silicon against the
emulated device (issue 45: "compare the kernels' outputs on silicon with the emulated device's on the same inputs").

    python benchmarks/gpu_kernels.py --save kernels.npz                              # on the GPU (gpu_suite's kernels)
    LAYERFORGE_EMULATED_GPU=1 python benchmarks/gpu_kernels.py --against kernels.npz  # here, on what came back
    python benchmarks/gpu_kernels.py --profile                                       # one ResNet-50 forward, for ncu

The inputs come from fixed seeds, so the two runs see the same bits. Every entry point of kernels/cuda/*.cu runs
(im2col / col2im, the implicit-GEMM convolution's forward and both backward kernels, max and average pooling,
LRN, softmax loss, BatchNorm's statistics and backward, the fused BatchNorm + Scale + ReLU) in float32 and float64,
and the GEMM (kernels/cuda/gemm.py) in float64 and in float32 under each of blas.GEMM_PRECISIONS. ``--against``
prints one row per output: ``||got - saved|| / ||saved||``, the largest difference, the share of elements with
equal bits, and ``differs`` where the relative difference is over ``TOLERANCE`` for its kind (float rounding in a
different order for the kernels; the 16-bit and TF32 formats' rounding for the products, which cuBLAS's fast
compute types may do in higher precision than the emulated cuBLAS does); integer outputs (max pooling's argmax,
softmax loss's count) must be equal. Exit status 1 when any output differs.
"""
import argparse
import os
import sys

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DTYPES = ("float32", "float64")
# relative norm of the difference allowed, by output kind: kernels' float sums in another order (FMA contraction,
# atomics), and the GEMM's precisions: cuBLAS's FAST_16F / FAST_16BF may multiply in TF32 or better where the
# emulated cuBLAS rounds the operands to the 16-bit format (kernels.blas), so up to that format's rounding
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "fp32": 1e-5, "tf32": 2e-3, "fp16": 2e-3, "bf16": 1e-2}
# (cin, size, cout, kernel, stride, pad) of ResNet-50's res3 3x3 convolution, for --profile
PROFILE_CONV = (128, 28, 128, 3, 1, 1)
PROFILE_BATCH = 32


def rand(shape, dtype, seed, low=-1.0, high=1.0):
    return numpy.random.default_rng(seed).uniform(low, high, shape).astype(dtype)


def kernel_outputs(xp, dtype):
    """``{name: numpy array}``: every kernel entry point's outputs for fixed float inputs of ``dtype``, on ``xp``."""
    from layerforge.backend import to_numpy
    from layerforge.kernels import batch_norm, fused_batch_norm, im2col, implicit_gemm, lrn, pooling, softmax_loss
    from layerforge.kernels.output_size import conv_output_size, pooling_output_size

    out = {}

    def put(name, *arrays):
        for i, a in enumerate(arrays):
            out[f"{dtype}/{name}" + (f"/{i}" if len(arrays) > 1 else "")] = to_numpy(a).copy()

    x = rand((2, 16, 14, 14), dtype, 0)
    for geometry in ((3, 3, 1, 1, 1, 1, 1, 1), (3, 3, 2, 2, 1, 1, 1, 1), (3, 3, 1, 1, 2, 2, 2, 2)):
        tag = "k{}s{}p{}d{}".format(*geometry[::2])
        col = im2col.im2col(xp.asarray(x), *geometry)
        put(f"im2col/{tag}", col)
        put(f"col2im/{tag}", im2col.col2im(xp.asarray(rand(col.shape, dtype, 1)), *geometry[2:6], 14, 14,
                                          *geometry[6:]))

    x = rand((2, 32, 14, 14), dtype, 2)
    for geometry, group in (((3, 3, 1, 1, 1, 1, 1, 1), 1), ((1, 1, 1, 1, 0, 0, 1, 1), 1),
                            ((3, 3, 2, 2, 1, 1, 1, 1), 1), ((3, 3, 1, 1, 1, 1, 1, 1), 2)):
        k, s = geometry[0], geometry[2]
        o = conv_output_size(14, k, s, geometry[4])
        W, b = rand((64, 32 // group, k, k), dtype, 3) * 0.1, rand(64, dtype, 4)
        gy = rand((2, 64, o, o), dtype, 5)
        engine = implicit_gemm.ImplicitGemmConv(geometry, group)
        y = xp.zeros((2, 64, o, o), dtype)
        xs, Ws, bs, gys = (xp.asarray(a) for a in (x, W, b, gy))
        engine.forward(xs, Ws, bs, y)
        gW, gb, gx = xp.ones(W.shape, dtype), xp.zeros(64, dtype), xp.zeros(x.shape, dtype)
        engine.backward(xs, Ws, gys, gW, gb, gx)  # gW starts at 1: the filter gradient accumulates (atomics)
        put(f"implicit_gemm/k{k}s{s}g{group}", y, gW, gb, gx)
        engine.release()

    x = rand((2, 16, 13, 13), dtype, 6)
    g = (3, 3, 2, 2, 1, 1)
    oh = pooling_output_size(13, 3, 2, 1, padded=True)
    y, argmax = pooling.max_pooling_forward(xp.asarray(x), *g, oh, oh)
    gy = xp.asarray(rand(y.shape, dtype, 7))
    put("max_pooling/forward", y, to_numpy(argmax).astype(numpy.int64))
    put("max_pooling/backward", pooling.max_pooling_backward(gy, argmax, x.shape, *g))
    put("average_pooling/forward", pooling.average_pooling_forward(xp.asarray(x), *g, oh, oh))
    put("average_pooling/backward", pooling.average_pooling_backward(gy, x.shape, *g))

    x, gy = xp.asarray(rand((2, 16, 7, 7), dtype, 8)), xp.asarray(rand((2, 16, 7, 7), dtype, 9))
    y, scale = lrn.lrn_across_forward(x, 5, 1e-4 / 5, 1.0, 0.75)
    put("lrn/forward", y, scale)
    put("lrn/backward", lrn.lrn_across_backward(x, scale, gy, 5, 1e-4 / 5, 0.75, xp.zeros_like(x)))

    logits = rand((8, 10, 4), dtype, 10, -3, 3)
    prob = xp.asarray(numpy.exp(logits) / numpy.exp(logits).sum(axis=1, keepdims=True))
    label = xp.asarray(numpy.random.default_rng(11).integers(0, 10, (8, 4)).astype(dtype))
    loss, count = softmax_loss.softmax_loss_forward(prob, label, 8, 10, 4, 2)
    put("softmax_loss/forward", loss, numpy.int64(int(count)))
    put("softmax_loss/backward", softmax_loss.softmax_loss_backward(prob, label, 8, 10, 4, 0.25, 2))

    x, gy = xp.asarray(rand((8, 64, 196), dtype, 12, 0, 3)), xp.asarray(rand((8, 64, 196), dtype, 13))
    centred = xp.zeros_like(x)
    mean, var = batch_norm.batch_stats(x, centred)
    inv_std = 1 / xp.sqrt(var + 1e-5)
    x_norm = xp.zeros_like(x)
    batch_norm.normalize(x, mean, inv_std, x_norm)
    put("batch_norm/statistics", mean, var, centred)
    put("batch_norm/normalize", x_norm)
    put("batch_norm/backward", batch_norm.batch_norm_backward(gy, x_norm, inv_std, xp.zeros_like(x)))

    gamma, beta = xp.asarray(rand(64, dtype, 14, 0.5, 1.5)), xp.asarray(rand(64, dtype, 15))
    y = xp.zeros_like(x)
    fused_batch_norm.scale_shift_relu(x_norm, gamma, beta, 0.0, y)
    g_gamma, g_beta = xp.zeros(64, dtype), xp.zeros(64, dtype)
    gx = fused_batch_norm.bn_scale_relu_backward(gy, y, x_norm, inv_std, gamma, 0.0, True, g_gamma, g_beta,
                                                 xp.zeros_like(x))
    put("fused_batch_norm/forward", y)
    put("fused_batch_norm/backward", g_gamma, g_beta, gx)
    return out


def gemm_outputs(xp):
    """``{name: numpy array}``: cuBLAS's product (kernels.blas.matmul, a ResNet-50 3x3 convolution's (Cout, K) @
    (K, P) at 14 x 14) in float64, and in float32 under each of blas.GEMM_PRECISIONS."""
    from layerforge.backend import to_numpy
    from layerforge.kernels import blas

    out = {}
    before = blas.gemm_precision()
    a64, b64 = rand((256, 2304), "float64", 20), rand((2304, 196), "float64", 21)
    out["float64/gemm"] = to_numpy(blas.matmul(xp.asarray(a64), xp.asarray(b64))).copy()
    try:
        for precision in blas.GEMM_PRECISIONS:
            blas.set_gemm_precision(precision)
            a, b = (xp.asarray(m.astype(numpy.float32)) for m in (a64, b64))
            out[f"{precision}/gemm"] = to_numpy(blas.matmul(a, b)).copy()
    finally:
        blas.set_gemm_precision(before)
    return out


def all_outputs(xp):
    """Every output of :func:`kernel_outputs` (both dtypes) and :func:`gemm_outputs`."""
    out = {}
    for dtype in DTYPES:
        out.update(kernel_outputs(xp, dtype))
    out.update(gemm_outputs(xp))
    return out


def save(path, xp, device):
    """:func:`all_outputs` on ``xp`` into the ``.npz`` file ``path``, with the ``device``'s name; returns how many."""
    outputs = all_outputs(xp)
    numpy.savez_compressed(path, device=numpy.array(device), **outputs)
    return len(outputs)


def compare(got, saved):
    """Rows ``(name, relative norm of the difference, largest difference, share of equal elements, differs)``,
    one per output of either (an output one of them lacks, or of another shape: ``differs`` with no figures)."""
    rows = []
    for name in sorted(set(saved) | set(got)):
        if name not in got or name not in saved or got[name].shape != numpy.shape(saved[name]):
            rows.append((name, None, None, None, True))
            continue
        ref = numpy.asarray(saved[name])
        a = numpy.asarray(got[name])
        if ref.dtype.kind in "iub":
            equal = float(numpy.mean(a == ref)) if ref.size else 1.0
            rows.append((name, 0.0 if equal == 1.0 else 1.0, float(numpy.abs(a.astype(float) - ref).max(initial=0)),
                         equal, equal < 1.0))
            continue
        diff = a.astype(numpy.float64) - ref
        norm = float(numpy.linalg.norm(ref))
        relative = float(numpy.linalg.norm(diff)) / norm if norm else float(numpy.abs(diff).max(initial=0))
        equal = float(numpy.mean(a == ref)) if ref.size else 1.0
        kind = name.split("/")[0]
        differs = not numpy.isfinite(relative) or relative > TOLERANCE[kind]
        rows.append((name, relative, float(numpy.abs(diff).max(initial=0)), equal, differs))
    return rows


def table(rows):
    """``rows`` of :func:`compare` as a Markdown table."""
    lines = ["| output | rel. norm of difference | largest difference | equal bits | |", "|---|---|---|---|---|"]
    for name, relative, largest, equal, differs in rows:
        if relative is None:
            lines.append(f"| {name} | missing on one side, or shapes differ | | | differs |")
            continue
        lines.append(f"| {name} | {relative:.2e} | {largest:.2e} | {100 * equal:.1f}% | "
                     f"{'differs' if differs else ''} |")
    return "\n".join(lines)


def profile(xp, batch=PROFILE_BATCH):
    """One implicit-GEMM forward of ResNet-50's res3 3x3 convolution (``batch`` images), after one call that compiles
    the kernel: ``ncu --launch-skip 1 --launch-count 1 --kernel-name conv_forward`` profiles the second."""
    from layerforge.kernels import implicit_gemm

    cin, s, cout, k, stride, pad = PROFILE_CONV
    x = xp.asarray(rand((batch, cin, s, s), "float32", 30))
    W = xp.asarray(rand((cout, cin, k, k), "float32", 31) * 0.05)
    b, y = xp.zeros(cout, "float32"), xp.empty((batch, cout, s, s), "float32")
    engine = implicit_gemm.ImplicitGemmConv((k, k, stride, stride, pad, pad, 1, 1), 1)
    for _ in range(2):
        engine.forward(x, W, b, y)
    xp.cuda.Device().synchronize()
    return float(abs(y).sum())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--save", metavar="NPZ", help="run every kernel on this process's cupy and save the outputs")
    what.add_argument("--against", metavar="NPZ", help="run every kernel here and compare with the saved outputs")
    what.add_argument("--profile", action="store_true", help="one implicit-GEMM forward of a ResNet-50 shape")
    parser.add_argument("--batch", type=int, default=PROFILE_BATCH, help="images of --profile's forward")
    args = parser.parse_args(argv)
    import layerforge  # noqa: F401 - puts the emulated device in cupy's place under LAYERFORGE_EMULATED_GPU
    import cupy
    from layerforge.backend import gpu_name

    if args.profile:
        print(f"conv_forward {PROFILE_CONV} batch {args.batch}: sum |y| {profile(cupy, args.batch):.6g}")
        return 0
    if args.save:
        print(f"{save(args.save, cupy, gpu_name(0))} outputs of {gpu_name(0)} -> {args.save}")
        return 0
    outputs = all_outputs(cupy)
    with numpy.load(args.against) as saved:
        device = str(saved["device"])
        rows = compare(outputs, {k: saved[k] for k in saved.files if k != "device"})
    print(f"{gpu_name(0)} against {device} ({args.against}):")
    print(table(rows))
    differing = [r[0] for r in rows if r[4]]
    print(f"{len(rows)} outputs, {len(differing)} differ" + (": " + ", ".join(differing) if differing else ""))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
