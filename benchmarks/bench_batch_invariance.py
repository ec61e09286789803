"""Batch-invariant results (``LAYERFORGE_BATCH_INVARIANT=1``): what they cost, and whether results move with the batch.

    python benchmarks/bench_batch_invariance.py [--nets lenet,alexnet,resnet50,vgg16] [--batches 1,10,64]
        [--repeat 5] [--rounds 2] [--threads 2]
    python benchmarks/bench_batch_invariance.py --layers 40 --nets alexnet --batches 1   # where a pass's cost is

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
    that net), random data and labels."""
    import numpy

    from bench_train import NETS, layerforge_def
    from layerforge import Net

    shape, nodes = NETS[net_name]()
    net = Net(layerforge_def(nodes, batch, shape), phase="test")
    rs = numpy.random.RandomState(0)
    net.blobs["data"].data[...] = rs.rand(*net.blobs["data"].shape) * 255 - 128
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
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]), int(args.child[2]))
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
