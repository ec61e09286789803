"""Batch-invariant results (``LAYERFORGE_BATCH_INVARIANT=1``): what they cost, and whether results move with the batch.

    python benchmarks/bench_batch_invariance.py [--nets lenet,alexnet,resnet50,vgg16] [--batches 1,10,64]
        [--repeat 5] [--rounds 2] [--threads 2]
    python benchmarks/bench_batch_invariance.py --layers 40 --nets alexnet --batches 1   # where a pass's cost is
    python benchmarks/bench_batch_invariance.py --products --repeat 20   # thin_gemm against OpenBLAS, product by product

For each net of bench_train.py (Input layers, random weights) and each batch: the time of one forward pass
(inference) and of one forward + backward pass (training) with the switch off (AUTO picks among all convolution
engines at this batch, InnerProduct runs one GEMM over the batch) and on (the products OpenBLAS computes off its
large path go to kernels/thin_gemm.py; each convolution's forward arithmetic, GEMM or a Winograd, is chosen by the
first net that times it, here the batch's, and the net of one image follows it), side by side in one run, each
mode in its own subprocess with an engine cache of its own (the switch is read when a net is built), and the
largest |output of one image alone - the same image's output in the batch| over the net's last layer before the
loss in each mode. Times are the minimum of ``--repeat`` passes after AUTO has settled its engines, over
``--rounds`` pairs of processes run off, on, off, on (the least disturbed figure on a shared machine). Before the
table: the CPU's vector extensions, the BLAS kernel and the SGEMM limit (bench_train.machine_report).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]  # layerforge and bench_train from this checkout
BATCHES = (1, 10, 64)


def bench_net(net_name, batch):
    """(net, its last layer's top) of bench_train.py's ``net_name`` at ``batch``, TEST phase (Dropout passes its
    input through: a TRAIN net draws other masks for another batch; the "train" figure is forward + backward of
    that net), random data and labels: mean-subtracted pixels for the ImageNet nets, pixels scaled to [0, 1) for LeNet
    as its data layer scales them (unscaled, one image saturates its softmax and every gradient below the loss is
    denormal, about 6e-40, which the processor computes 100 times slower)."""
    import numpy

    from bench_train import NETS, layerforge_def
    from layerforge import Net

    shape, nodes = NETS[net_name]()
    net = Net(layerforge_def(nodes, batch, shape), phase="test")
    rs = numpy.random.RandomState(0)
    pixels = rs.rand(*net.blobs["data"].shape)
    net.blobs["data"].data[...] = pixels if net_name == "lenet" else pixels * 255 - 128
    net.blobs["label"].data[...] = rs.randint(shape[2], size=batch)
    return net, nodes[-1][0]


def child(net_name, batch, repeat):
    import numpy

    from layerforge.kernels.autotune import settle_engines

    net, out = bench_net(net_name, batch)
    single = bench_net(net_name, 1)[0]
    single.share_params_with(net)
    settle_engines(net, lambda k: net.forward_backward())
    settle_engines(single, lambda k: single.forward_backward())
    for_one, for_batch = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        net.forward()
        for_one.append(time.perf_counter() - t)
        t = time.perf_counter()
        net.forward_backward()
        for_batch.append(time.perf_counter() - t)
    net.forward()
    batched = net.blobs[out].data.copy()
    worst = 0.0
    for i in range(min(batch, 4)):
        single.blobs["data"].data[...] = net.blobs["data"].data[i:i + 1]
        single.forward()
        worst = max(worst, float(numpy.abs(single.blobs[out].data[0] - batched[i]).max()))
    engines = sorted({f"{k}:{v}" for layer in net.layers for k, v in getattr(layer, "engine_choice", {}).items()})
    print(json.dumps({"forward": min(for_one), "train": min(for_batch), "diff": worst, "engines": engines}))


def layers_in_process(net_name, batch, rounds, on_first):
    """One TEST net per mode in this process (each built, and its AUTO settled, under its mode; ``on_first``: the
    switch's net built first), then ``rounds`` forward passes of each, alternating, the switch toggled between
    them, every layer timed: ``[(layer, off seconds, on seconds)]``, minima, and the whole pass last."""
    from layerforge.kernels import blas
    from layerforge.kernels.autotune import settle_engines

    nets = {}
    for mode in (True, False) if on_first else (False, True):
        blas.set_batch_invariant(mode)
        net = nets[mode] = bench_net(net_name, batch)[0]
        settle_engines(net, lambda k, net=net: net.forward_backward())
    count = len(nets[False].layers)
    times = {mode: [[] for _ in range(count + 1)] for mode in nets}
    for r in range(rounds):
        for mode in (False, True) if r % 2 else (True, False):
            blas.set_batch_invariant(mode)
            start = time.perf_counter()
            for i in range(count):
                t = time.perf_counter()
                nets[mode].forward_layer(i)
                times[mode][i].append(time.perf_counter() - t)
            times[mode][count].append(time.perf_counter() - start)
    names = [layer.name for layer in nets[False].layers] + ["(the pass)"]
    return [(names[i], min(times[False][i]), min(times[True][i])) for i in range(count + 1)]


def products(repeat):
    """The two measurements behind blas.FEW_ROWS and blas.one_blas_thread: OpenBLAS on one thread against thin_gemm
    for products of few rows (medians of ``repeat``, microseconds), and AlexNet's fc6 at batch 1 (one row) in
    thin_gemm while OpenBLAS's threads sleep and right after a product they shared, beside OpenBLAS's GEMV."""
    import numpy

    from layerforge.kernels import blas, thin_gemm

    def median(f):
        return _median(f, repeat)

    rs = numpy.random.RandomState(0)
    print("product of few rows            rows | OpenBLAS 1 thread us | thin_gemm us")
    for label, k, n, transposed, rows in (("W.T 800 x 500 (LeNet ip1)", 800, 500, True, (4, 10, 32, 64)),
                                          ("W.T 9216 x 4096 (fc6)", 9216, 4096, True, (4, 10, 32, 64)),
                                          ("columns 576 x 3136", 576, 3136, False, (4, 10, 20, 64)),
                                          ("columns 4608 x 196", 4608, 196, False, (4, 10, 64))):
        b = rs.randn(n, k).astype(numpy.float32).T if transposed else rs.randn(k, n).astype(numpy.float32)
        for m in rows:
            a = rs.randn(m, k).astype(numpy.float32)
            out = numpy.empty((m, n), numpy.float32)
            with blas.one_blas_thread():
                openblas = median(lambda: numpy.matmul(a, b, out=out))
            thin = median(lambda: thin_gemm.matmul(a, b, out, threaded=False))
            print(f"{label:30} {m:5d} | {openblas:20.0f} | {thin:12.0f}")
    w = rs.randn(4096, 9216).astype(numpy.float32)
    x, y = rs.randn(1, 9216).astype(numpy.float32), numpy.empty((1, 4096), numpy.float32)
    shared = rs.randn(384, 2304).astype(numpy.float32), rs.randn(2304, 169).astype(numpy.float32)
    one_row = lambda: thin_gemm.matmul(x, w.T, y, threaded=False)  # noqa: E731
    after = median(lambda: (numpy.matmul(*shared), one_row()))
    after -= median(lambda: numpy.matmul(*shared))
    time.sleep(0.5)  # OpenBLAS's threads stop spinning after about 0.1 s
    print(f"fc6 at batch 1 (1 x 9216 x 4096) in thin_gemm: {median(one_row) / 1e3:.2f} ms while OpenBLAS's threads "
          f"sleep, about {after / 1e3:.2f} ms right after a product they shared; OpenBLAS's GEMV "
          f"{median(lambda: numpy.matmul(x, w.T, out=y)) / 1e3:.2f} ms")


def split_products(repeat):
    """The measurement behind the switch's thresholds for sharing a product between the kernel threads
    (thin_gemm.PARALLEL_MULTIPLY_ADDS, blas.SPLIT_MULTIPLY_ADDS): LeNet's and ResNet-50's products at batch 1 and 10
    on one kernel thread, shared with the product threads (every threshold 0), and on OpenBLAS's own threads
    (medians of ``repeat``, microseconds)."""
    import numpy

    from layerforge.kernels import blas, thin_gemm, threadpool

    blas.set_batch_invariant(True)
    rs = numpy.random.RandomState(0)
    print(f"{'product (a x b)':36} {'M mult-adds':>11} | {'1 thread':>8} {'shared':>8} | {'OpenBLAS':>8}  us")
    for label, shape_a, shape_b, transposed in (
            ("LeNet conv1 b1 20x25 @ 25x576", (20, 25), (1, 25, 576), False),
            ("LeNet conv1 b10", (20, 25), (10, 25, 576), False),
            ("LeNet conv2 b1 50x500 @ 500x64", (50, 500), (1, 500, 64), False),
            ("LeNet conv2 b10", (50, 500), (10, 500, 64), False),
            ("LeNet ip1 b1 1x800 @ 800x500", (1, 800), (500, 800), True),
            ("LeNet ip1 b10", (10, 800), (500, 800), True),
            ("64x128 @ 128x128", (64, 128), (128, 128), False),
            ("64x256 @ 256x128", (64, 256), (256, 128), False),
            ("64x256 @ 256x256", (64, 256), (256, 256), False),
            ("ResNet-50 b1 256x64 @ 64x3136", (256, 64), (64, 3136), False),
            ("ResNet-50 b1 64x256 @ 256x3136", (64, 256), (256, 3136), False),
            ("ResNet-50 b1 128x1152 @ 1152x784", (128, 1152), (1152, 784), False),
            ("ResNet-50 b1 2048x512 @ 512x49", (2048, 512), (512, 49), False),
            ("ResNet-50 b1 fc 1x2048 @ 2048x1000", (1, 2048), (1000, 2048), True)):
        a = rs.randn(*shape_a).astype(numpy.float32)
        b = rs.randn(*shape_b).astype(numpy.float32)
        b = b.T if transposed else b
        out = blas.matmul(a, b)
        multiply_adds = out.size * a.shape[-1]
        openblas = _median(lambda: numpy.matmul(a, b, out=out), repeat)
        time.sleep(0.25)  # OpenBLAS's threads spin for about 0.1 s after a product on the core a product thread needs
        times = []
        for threads, shared in ((1, False), (2, True)):
            threadpool.set_num_threads(threads)
            with _thresholds(thin_gemm, blas, shared), blas.one_blas_thread():
                times.append(_median(lambda: blas.matmul(a, b, out=out), repeat))
        threadpool.set_num_threads(None)
        times.append(openblas)
        print(f"{label:36} {multiply_adds / 1e6:11.2f} | {times[0]:8.1f} {times[1]:8.1f} | {times[2]:8.1f}")


class _thresholds:
    # every threshold for sharing a product at its least (``shared``), put back after
    def __init__(self, thin_gemm, blas, shared):
        self.names = [(thin_gemm, "PARALLEL_MULTIPLY_ADDS", 0), (thin_gemm, "PARALLEL_MULTIPLY_ADDS_FEW_ROWS", 0),
                      (blas, "SPLIT_MULTIPLY_ADDS", 1)] if shared else []

    def __enter__(self):
        self.saved = [getattr(module, name) for module, name, _ in self.names]
        for module, name, value in self.names:
            setattr(module, name, value)

    def __exit__(self, *exc):
        for (module, name, _), value in zip(self.names, self.saved):
            setattr(module, name, value)


def _median(f, repeat):
    f()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return sorted(times)[repeat // 2] * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="lenet,alexnet,resnet50,vgg16")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--rounds", type=int, default=2, help="off / on subprocess pairs per case (A/B/A/B)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, metavar="ROUNDS",
                        help="instead: an in-process A/B of each layer's forward, ROUNDS alternating passes, each "
                             "net built first in one mode and then in the other (the order moves a pass by a few %%)")
    parser.add_argument("--products", action="store_true",
                        help="instead: OpenBLAS on one thread against thin_gemm for products of few rows, and fc6 "
                             "at batch 1 with OpenBLAS's threads asleep and spinning (medians of --repeat)")
    parser.add_argument("--split", action="store_true",
                        help="instead: LeNet's and ResNet-50's products on one kernel thread, shared with the product "
                             "threads, and on OpenBLAS's threads (medians of --repeat)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]), int(args.child[2]))
    if args.products or args.split:
        import bench_train
        print("\n".join(bench_train.machine_report(args.threads)[1]))
        return (products if args.products else split_products)(args.repeat)
    if args.layers:
        os.environ.setdefault("LAYERFORGE_CACHE_DIR", "off")  # each net times its engines under its mode
        for net_name in args.nets.split(","):
            for batch in map(int, args.batches.split(",")):
                for on_first in (False, True):
                    rows = layers_in_process(net_name, batch, args.layers, on_first)
                    print(f"{net_name} batch {batch}, {'on' if on_first else 'off'} net built first: "
                          "layers whose forward moved by over 3% and 5 us (us off / on), then the pass")
                    for name, off, on in rows:
                        if name == "(the pass)" or (abs(on - off) > 0.03 * off and abs(on - off) > 5e-6):
                            print(f"  {name:24} {off * 1e6:10.1f} {on * 1e6:10.1f} {on / off - 1:+7.1%}")
        return
    import bench_train
    print("\n".join(bench_train.machine_report(args.threads)[1]))
    print(f"{'net':8} {'batch':>5} | {'forward ms off':>14} {'on':>8} {'cost':>7} | {'train ms off':>12} {'on':>8} "
          f"{'cost':>7} | {'max |alone - in batch| off':>26} {'on':>8}")
    for net_name in args.nets.split(","):
        for batch in map(int, args.batches.split(",")):
            result = {}
            for _ in range(args.rounds):  # alternating processes: a load that comes and goes hits both modes
                for mode in ("0", "1"):
                    with tempfile.TemporaryDirectory() as cache:  # each process times its engines itself
                        env = dict(os.environ, LAYERFORGE_BATCH_INVARIANT=mode, LAYERFORGE_CACHE_DIR=cache,
                                   OPENBLAS_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
                        proc = subprocess.run([sys.executable, __file__, "--child", net_name, str(batch),
                                               str(args.repeat)], capture_output=True, text=True, env=env, check=True)
                    run = json.loads(proc.stdout.strip().splitlines()[-1])
                    best = result.setdefault(mode, run)
                    for key in ("forward", "train"):
                        best[key] = min(best[key], run[key])
            off, on = result["0"], result["1"]
            print(f"{net_name:8} {batch:5d} | {off['forward'] * 1e3:14.2f} {on['forward'] * 1e3:8.2f} "
                  f"{on['forward'] / off['forward'] - 1:+7.1%} | {off['train'] * 1e3:12.2f} {on['train'] * 1e3:8.2f} "
                  f"{on['train'] / off['train'] - 1:+7.1%} | {off['diff']:26.3g} {on['diff']:8.3g}")
            print(f"{'':14} engines off: {' '.join(off['engines'])}\n{'':14} engines on:  {' '.join(on['engines'])}")


if __name__ == "__main__":
    main()
