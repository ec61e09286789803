"""Forward-backward time of every zoo net: layerforge (numpy) next to PyTorch CPU on the same architecture.

    python benchmarks/bench_zoo.py                       # every net, 2 threads, a few iterations each
    python benchmarks/bench_zoo.py --nets alexnet_net,resnet50_net --iterations 3 --threads 2 --json out.json

The PyTorch model is not written by hand: the script walks the built layerforge Net (TRAIN phase, the
synthetic SyntheticData variant) and runs each layer as the equivalent torch op on tensors of the same shapes
(Conv2d with the same stride/pad/group, ceil-mode pooling, LRN, batch-statistics BatchNorm, Scale,
Eltwise, Concat, Dropout, SoftmaxWithLoss), so both sides compute the same net; autograd does torch's
backward. Both use the same number of threads (BLAS threads for numpy, torch.set_num_threads for torch).
Warm-up until every AUTO convolution has chosen its engines (torch: one), then the mean of ``--iterations`` timed ones.
"""
import argparse
import json
import os
import sys
import time


def _set_threads(n):
    # must happen before numpy (and its BLAS) is imported
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ[var] = str(n)


# net -> batch (VGG-16 at 4: its activations at 8 make the run too long for a shared 2-core machine)
NETS = {"lenet": 8, "cifar10_quick_net": 8, "cifar10_full_net": 8, "alexnet_net": 8, "googlenet_net": 8,
        "vgg16_net": 4, "resnet50_net": 8, "resnet101_net": 8, "resnet152_net": 8}


# layers whose tops the torch side takes as they are (the data of the layerforge run)
SOURCES = ("DummyData", "SyntheticData", "Input", "Data", "ImageData")


def torch_runner(net, torch):
    """A function running forward + backward of ``net``'s graph in torch; parameters shaped as net's."""
    import torch.nn.functional as F
    from layerforge.layers.layer_param import read_pair
    from layerforge.layers.pooling import Pooling

    params = []

    def param(blob):
        t = torch.randn(*blob.shape, dtype=torch.float32) * 0.01
        t.requires_grad_(True)
        params.append(t)
        return t

    ops = []
    for i, layer in enumerate(net.layers):
        lp, ltype = layer.layer_param, layer.type
        bottoms, tops = list(net.bottom_names(i)), list(net.top_names(i))
        if ltype == "Convolution":
            w = param(layer.blobs[0])
            b = param(layer.blobs[1]) if len(layer.blobs) > 1 else None
            cfg = dict(stride=read_pair(lp, "convolution", "stride", 1), padding=read_pair(lp, "convolution", "pad", 0),
                       dilation=read_pair(lp, "convolution", "dilation", 1), groups=lp.convolution.group)
            ops.append((bottoms, tops, lambda x, w=w, b=b, cfg=cfg: F.conv2d(x, w, b, **cfg)))
        elif ltype == "InnerProduct":
            w = param(layer.blobs[0])
            b = param(layer.blobs[1]) if len(layer.blobs) > 1 else None
            ops.append((bottoms, tops, lambda x, w=w, b=b: F.linear(x.flatten(1), w, b)))
        elif ltype == "Pooling":
            kh, kw, sy, sx, ph, pw = Pooling.read_geometry(lp)
            shape = net.bottom_blobs(i)[0].shape
            k = (shape[2], shape[3]) if kh is None else (kh, kw)
            if lp.pooling.pool == "MAX":
                fn = lambda x, k=k, s=(sy, sx), p=(ph, pw): F.max_pool2d(x, k, s, p, ceil_mode=True)  # noqa: E731
            else:
                fn = lambda x, k=k, s=(sy, sx), p=(ph, pw): F.avg_pool2d(x, k, s, p, ceil_mode=True)  # noqa: E731
            ops.append((bottoms, tops, fn))
        elif ltype == "LRN":
            p = lp.lrn
            if p.norm_region == "WITHIN_CHANNEL":
                pad = (p.local_size - 1) // 2
                fn = lambda x, p=p, pad=pad: x * (1 + p.alpha * F.avg_pool2d(  # noqa: E731
                    x * x, p.local_size, 1, pad, count_include_pad=True)) ** -p.beta
            else:
                fn = lambda x, p=p: F.local_response_norm(x, p.local_size, p.alpha, p.beta, p.k)  # noqa: E731
            ops.append((bottoms, tops, fn))
        elif ltype == "ReLU":
            ops.append((bottoms, tops, F.relu))
        elif ltype == "Dropout":
            ops.append((bottoms, tops, lambda x, r=lp.dropout.dropout_ratio: F.dropout(x, r, training=True)))
        elif ltype == "BatchNorm":
            ops.append((bottoms, tops, lambda x, e=lp.batch_norm.eps: F.batch_norm(x, None, None, training=True, eps=e)))
        elif ltype == "Scale":
            s = param(layer.blobs[0])
            b = param(layer.blobs[1]) if len(layer.blobs) > 1 else None
            ops.append((bottoms, tops, lambda x, s=s, b=b: x * s.view(1, -1, 1, 1) + (
                0 if b is None else b.view(1, -1, 1, 1))))
        elif ltype == "Eltwise":
            ops.append((bottoms, tops, lambda *xs: sum(xs[1:], xs[0])))
        elif ltype == "Concat":
            ops.append((bottoms, tops, lambda *xs: torch.cat(xs, 1)))
        elif ltype == "Split":
            ops.append((bottoms, tops, lambda x, n=len(tops): (x,) * n))
        elif ltype == "SoftmaxWithLoss":
            weight = net.loss_weights(i)[0]
            ops.append((bottoms, tops, lambda x, y, w=weight: w * F.cross_entropy(x, y.long())))
        elif ltype in SOURCES + ("Accuracy",):
            ops.append((bottoms, tops, None))
        else:
            raise NotImplementedError(f"no torch equivalent for {ltype} in this benchmark")
    inputs = {name: torch.from_numpy(net.blobs[name].data.copy())
              for i, layer in enumerate(net.layers) if layer.type in SOURCES
              for name in net.top_names(i)}

    def step():
        blobs = dict(inputs)
        losses = []
        for bottoms, tops, fn in ops:
            if fn is None:
                continue
            out = fn(*[blobs[b] for b in bottoms])
            out = out if isinstance(out, tuple) else (out,)
            blobs.update(zip(tops, out))
            if out[0].dim() == 0:
                losses.append(out[0])
        sum(losses).backward()
        for p in params:
            p.grad = None

    return step, sum(p.numel() for p in params)


def bench(name, batch, iterations, torch):
    from layerforge.net import Net
    from layerforge.commands.time import warm_up
    from layerforge.net.netdef import load_net_def, set_batch_size

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", f"{name}.yaml")
    net = Net(set_batch_size(load_net_def(path), batch), phase="train")
    warm_up(net)
    t0 = time.perf_counter()
    for _ in range(iterations):
        net.forward()
        net.backward()
    ours = (time.perf_counter() - t0) / iterations
    step, n_params = torch_runner(net, torch)
    assert n_params == net.num_learnable, (n_params, net.num_learnable)
    step()
    t0 = time.perf_counter()
    for _ in range(iterations):
        step()
    theirs = (time.perf_counter() - t0) / iterations
    return {"net": name, "batch": batch, "layerforge_ms": 1000 * ours, "torch_ms": 1000 * theirs,
            "ratio": ours / theirs}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default=",".join(NETS), help="comma-separated zoo nets (configs/<name>.yaml)")
    parser.add_argument("--iterations", type=int, default=2, help="timed iterations per net (after the warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, help="one batch for every net (default: 8, VGG-16 4)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    _set_threads(args.threads)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    print(f"# forward+backward, TRAIN phase, synthetic data, {args.threads} threads, torch {torch.__version__}, "
          f"mean of {args.iterations} after warm-up (AUTO settled)", flush=True)
    print(f"{'net':<20} {'batch':>5} {'layerforge ms':>14} {'torch ms':>10} {'ratio':>6}", flush=True)
    for name in args.nets.split(","):
        r = bench(name, args.batch or NETS[name], args.iterations, torch)
        rows.append(r)
        print(f"{r['net']:<20} {r['batch']:>5} {r['layerforge_ms']:>14.1f} {r['torch_ms']:>10.1f} {r['ratio']:>6.2f}",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
