"""Training images/s (forward + backward + SGD update) in layerforge and in PyTorch CPU, side by side.

    python benchmarks/bench_train.py [--nets lenet,alexnet,resnet50,vgg16] [--iterations 3] [--threads 2]
                                     [--cpu-parallel AUTO|THREADS|REPLICAS] [--precision fp32|bf16]

Each net is described once below as a list of nodes; the same list builds a layerforge net (a dict
with Input, Convolution, BatchNorm + Scale, ...) and a PyTorch module, so both run the same
architecture: LeNet (Caffe's MNIST example), AlexNet (Caffe's bvlc_alexnet: LRN, grouped conv2/4/5,
227 x 227), VGG-16 (configuration D, 224 x 224) and ResNet-50 (torchvision's v1.5: stride in the
3x3 convolution; Caffe's BatchNorm + Scale is torch's affine BatchNorm2d). Pooling uses Caffe's ceil
rounding in both. The update is momentum SGD with weight decay on every parameter: layerforge's SGD solver
(apply_update, on the kernel threads) and torch.optim.SGD for torch.

layerforge runs in its default configuration, the one ``layerforge train`` uses on this machine
(layerforge/dataparallel/cpu_parallel.py: one process on ``--threads`` cores, or one single-threaded replica per
core on batch / cores; AUTO's choice is made, or taken from its cache, in a subprocess of its own before the timed
rounds, so its trial is never timed or counted); ``--cpu-parallel`` forces one. PyTorch runs with ``--threads``
intra-op threads on the same batch.

``--precision bf16``: layerforge with ``gemm_precision: BF16`` (every float32 product on bfloat16 operands, fp32
accumulation: layerforge/kernels/blas.py), PyTorch under ``torch.autocast("cpu", dtype=torch.bfloat16)``.

Before the table the benchmark prints what the figures depend on (:func:`describe_machine`, measured in a
subprocess with the benchmark's environment): the CPU and its vector extensions, the BLAS library numpy uses and
its kernel architecture (threadpoolctl), whether OPENBLAS_CORETYPE pins it, PyTorch's CPU capability, and the
machine's SGEMM rate (numpy, 2048^3, ``--threads`` threads): the limit that each net's training FLOP rate is
given as a fraction of (``lf % SGEMM``: 3 x the forward pass's FLOPs, :func:`forward_flops`, per second of a
training iteration, over that rate).

Every (framework, net) round runs in its own subprocess; ``--rounds`` alternate the two so that contention hits both
alike. Warm-up iterations run first (layerforge: until every AUTO convolution has settled its engines), then
``--iterations`` timed ones. Memory is the peak resident memory of the subprocess and all its descendants together,
sampled every 50 ms from outside (``PeakMemory``): the replicas' shared memory is counted once, as one process's
memory would be.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = {"lenet": 64, "alexnet": 16, "resnet50": 8, "vgg16": 4}


# --------------------------------------------------------------------------------------------------
# architectures: nodes (name, op, bottoms, params)

def lenet():
    return (1, 28, 10), [
        ("conv1", "conv", ["data"], dict(cout=20, k=5)), ("pool1", "maxpool", ["conv1"], dict(k=2, s=2)),
        ("conv2", "conv", ["pool1"], dict(cout=50, k=5)), ("pool2", "maxpool", ["conv2"], dict(k=2, s=2)),
        ("ip1", "ip", ["pool2"], dict(cout=500)), ("relu1", "relu", ["ip1"], {}),
        ("ip2", "ip", ["relu1"], dict(cout=10))]


def alexnet():
    n = []
    n += [("conv1", "conv", ["data"], dict(cout=96, k=11, s=4)), ("relu1", "relu", ["conv1"], {}),
          ("norm1", "lrn", ["relu1"], {}), ("pool1", "maxpool", ["norm1"], dict(k=3, s=2)),
          ("conv2", "conv", ["pool1"], dict(cout=256, k=5, p=2, g=2)), ("relu2", "relu", ["conv2"], {}),
          ("norm2", "lrn", ["relu2"], {}), ("pool2", "maxpool", ["norm2"], dict(k=3, s=2)),
          ("conv3", "conv", ["pool2"], dict(cout=384, k=3, p=1)), ("relu3", "relu", ["conv3"], {}),
          ("conv4", "conv", ["relu3"], dict(cout=384, k=3, p=1, g=2)), ("relu4", "relu", ["conv4"], {}),
          ("conv5", "conv", ["relu4"], dict(cout=256, k=3, p=1, g=2)), ("relu5", "relu", ["conv5"], {}),
          ("pool5", "maxpool", ["relu5"], dict(k=3, s=2))]
    n += [("fc6", "ip", ["pool5"], dict(cout=4096)), ("relu6", "relu", ["fc6"], {}), ("drop6", "dropout", ["relu6"], {}),
          ("fc7", "ip", ["drop6"], dict(cout=4096)), ("relu7", "relu", ["fc7"], {}), ("drop7", "dropout", ["relu7"], {}),
          ("fc8", "ip", ["drop7"], dict(cout=1000))]
    return (3, 227, 1000), n


def vgg16():
    n, prev = [], "data"
    for stage, (reps, c) in enumerate([(2, 64), (2, 128), (3, 256), (3, 512), (3, 512)], 1):
        for r in range(1, reps + 1):
            name = f"conv{stage}_{r}"
            n += [(name, "conv", [prev], dict(cout=c, k=3, p=1)), (f"relu{stage}_{r}", "relu", [name], {})]
            prev = f"relu{stage}_{r}"
        n.append((f"pool{stage}", "maxpool", [prev], dict(k=2, s=2)))
        prev = f"pool{stage}"
    n += [("fc6", "ip", [prev], dict(cout=4096)), ("relu6", "relu", ["fc6"], {}), ("drop6", "dropout", ["relu6"], {}),
          ("fc7", "ip", ["drop6"], dict(cout=4096)), ("relu7", "relu", ["fc7"], {}), ("drop7", "dropout", ["relu7"], {}),
          ("fc8", "ip", ["drop7"], dict(cout=1000))]
    return (3, 224, 1000), n


def _conv_bn(n, name, bottom, relu=True, **conv):
    n += [(name, "conv", [bottom], dict(bias=False, **conv)), ("bn_" + name, "bn", [name], {})]
    if relu:
        n.append(("relu_" + name, "relu", ["bn_" + name], {}))
        return "relu_" + name
    return "bn_" + name


def resnet50():
    n = []
    prev = _conv_bn(n, "conv1", "data", cout=64, k=7, s=2, p=3)
    n.append(("pool1", "maxpool", [prev], dict(k=3, s=2)))
    prev = "pool1"
    for stage, (blocks, c) in enumerate([(3, 64), (4, 128), (6, 256), (3, 512)], 2):
        for b in range(blocks):
            name, s = f"res{stage}{chr(97 + b)}", (2 if b == 0 and stage > 2 else 1)
            x = _conv_bn(n, name + "_2a", prev, cout=c, k=1)
            x = _conv_bn(n, name + "_2b", x, cout=c, k=3, s=s, p=1)
            x = _conv_bn(n, name + "_2c", x, relu=False, cout=4 * c, k=1)
            short = _conv_bn(n, name + "_1", prev, relu=False, cout=4 * c, k=1, s=s) if b == 0 else prev
            n += [(name, "add", [x, short], {}), (name + "_relu", "relu", [name], {})]
            prev = name + "_relu"
    n += [("pool5", "avepool", [prev], {}), ("fc1000", "ip", ["pool5"], dict(cout=1000))]
    return (3, 224, 1000), n


NETS = {"lenet": lenet, "alexnet": alexnet, "vgg16": vgg16, "resnet50": resnet50}
FILL = {"type": "msra"}


def layerforge_def(nodes, batch, shape, fuse_batch_norm=True):
    """The nodes as a layerforge net dict; in-place layers where Caffe's model files put them."""
    c, size, classes = shape
    layers = [{"name": "data", "type": "Input", "top": ["data", "label"],
               "input": {"shape": [[batch, c, size, size], [batch]]}}]
    blob = {"data": "data"}  # node name -> blob holding its output (in-place ops keep their bottom's name)
    for name, op, bottoms, p in nodes:
        b = [blob[x] for x in bottoms]
        top = name
        if op == "conv":
            layers.append({"name": name, "type": "Convolution", "bottom": b, "top": name, "convolution": {
                "num_output": p["cout"], "kernel_size": p["k"], "stride": p.get("s", 1), "pad": p.get("p", 0),
                "group": p.get("g", 1), "bias_term": p.get("bias", True), "weight_filler": FILL}})
        elif op == "bn":
            top = b[0]
            layers += [{"name": name, "type": "BatchNorm", "bottom": b, "top": top},
                       {"name": name + "_scale", "type": "Scale", "bottom": top, "top": top, "scale": {"bias_term": True}}]
        elif op in ("relu", "dropout"):
            top = b[0]
            layers.append({"name": name, "type": "ReLU" if op == "relu" else "Dropout", "bottom": b, "top": top})
        elif op == "lrn":
            layers.append({"name": name, "type": "LRN", "bottom": b, "top": name,
                           "lrn": {"local_size": 5, "alpha": 1e-4, "beta": 0.75}})
        elif op in ("maxpool", "avepool"):
            pool = {"pool": "MAX", "kernel_size": p["k"], "stride": p["s"]} if op == "maxpool" else \
                {"pool": "AVE", "global_pooling": True}
            layers.append({"name": name, "type": "Pooling", "bottom": b, "top": name, "pooling": pool})
        elif op == "ip":
            layers.append({"name": name, "type": "InnerProduct", "bottom": b, "top": name,
                           "inner_product": {"num_output": p["cout"], "weight_filler": {"type": "xavier"}}})
        elif op == "add":
            layers.append({"name": name, "type": "Eltwise", "bottom": b, "top": name})
        blob[name] = top
    layers.append({"name": "loss", "type": "SoftmaxWithLoss", "bottom": [blob[nodes[-1][0]], "label"], "top": "loss"})
    return {"name": "bench", "fuse_batch_norm": fuse_batch_norm, "layers": layers}


def torch_module(nodes, shape):
    import torch
    from torch import nn

    c, size, classes = shape
    channels, mods = {"data": c}, nn.ModuleDict()
    spatial = {"data": size}
    for name, op, bottoms, p in nodes:
        cin, s_in = channels[bottoms[0]], spatial[bottoms[0]]
        cout, s_out = cin, s_in
        if op == "conv":
            cout = p["cout"]
            mods[name] = nn.Conv2d(cin, cout, p["k"], p.get("s", 1), p.get("p", 0), groups=p.get("g", 1),
                                   bias=p.get("bias", True))
            s_out = (s_in + 2 * p.get("p", 0) - p["k"]) // p.get("s", 1) + 1
        elif op == "bn":
            mods[name] = nn.BatchNorm2d(cin)
        elif op == "lrn":
            mods[name] = nn.LocalResponseNorm(5, 1e-4, 0.75)
        elif op == "maxpool":
            mods[name] = nn.MaxPool2d(p["k"], p["s"], ceil_mode=True)
            s_out = -(-(s_in - p["k"]) // p["s"]) + 1
        elif op == "ip":
            cout = p["cout"]
            mods[name] = nn.Linear(cin * s_in * s_in, cout)
            s_out = 1
        elif op == "avepool":
            s_out = 1
        channels[name], spatial[name] = cout, s_out

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.mods = mods

        def forward(self, x):
            out = {"data": x}
            for name, op, bottoms, p in nodes:
                a = out[bottoms[0]]
                if op == "relu":
                    y = torch.relu(a)
                elif op == "dropout":
                    y = nn.functional.dropout(a, 0.5, self.training)
                elif op == "add":
                    y = a + out[bottoms[1]]
                elif op == "avepool":
                    y = a.mean(dim=(2, 3), keepdim=True)
                elif op == "ip":
                    y = self.mods[name](a.flatten(1))
                else:
                    y = self.mods[name](a)
                out[name] = y
            return out[nodes[-1][0]]

    return Net()


# --------------------------------------------------------------------------------------------------
# one framework, one net (run in a subprocess)

def forward_flops(net_name, batch):
    """FLOPs of one forward pass (2 per multiply-add) of the convolutions and inner products of ``net_name``."""
    (c, size, _), nodes = NETS[net_name]()
    channels, spatial, macs = {"data": c}, {"data": size}, 0
    for name, op, bottoms, p in nodes:
        cin, s_in = channels[bottoms[0]], spatial[bottoms[0]]
        cout, s_out = cin, s_in
        if op == "conv":
            cout, k, stride, pad = p["cout"], p["k"], p.get("s", 1), p.get("p", 0)
            s_out = (s_in + 2 * pad - k) // stride + 1
            macs += batch * cout * s_out * s_out * cin // p.get("g", 1) * k * k
        elif op == "maxpool":
            s_out = -(-(s_in - p["k"]) // p["s"]) + 1
        elif op == "ip":
            cout, s_out = p["cout"], 1
            macs += batch * cin * s_in * s_in * cout
        elif op == "avepool":
            s_out = 1
        channels[name], spatial[name] = cout, s_out
    return 2 * macs


SOLVER = {"type": "SGD", "base_lr": 1e-3, "lr_policy": "fixed", "momentum": 0.9, "weight_decay": 5e-4,
          "max_iter": 10 ** 6, "dtype": "float32", "snapshot_after_train": False}


def layerforge_solver_dict(net_name, fuse_batch_norm=True, batch=None, precision="fp32"):
    """The SGD solver (momentum, weight decay) of the benchmark, over the layerforge net (Input layers); products
    on bfloat16 operands with ``precision`` bf16."""
    shape, nodes = NETS[net_name]()
    extra = {"gemm_precision": "BF16"} if precision == "bf16" else {}
    return dict(SOLVER, net_param=layerforge_def(nodes, batch or BATCH[net_name], shape, fuse_batch_norm), **extra)


def layerforge_solver(net_name, fuse_batch_norm=True, batch=None, precision="fp32"):
    """The benchmark's solver in this process, with planned memory and the random data (bench_breakdown.py)."""
    sys.path.insert(0, ROOT)
    from layerforge.solvers import get_solver

    solver = get_solver(layerforge_solver_dict(net_name, fuse_batch_norm, batch, precision))
    solver.net.optimize_memory()
    fill_inputs(solver.net)
    return solver


def fill_inputs(net, split=None):
    """Random data and labels of the whole batch (seed 0); a replica of a split batch takes its samples."""
    import numpy

    index, count = split or (0, 1)
    g = numpy.random.default_rng(0)
    data, label = net.blobs["data"], net.blobs["label"]
    x = g.standard_normal((data.shape[0] * count,) + tuple(data.shape[1:]))
    classes = net.bottom_blobs(len(net.layers) - 1)[0].shape[1]  # the scores the loss reads
    y = g.integers(0, classes, label.shape[0] * count)
    data.data[...] = x[index::count]
    label.data[...] = y[index::count]


def replica_setup(g, solver):
    """WorkerOptions.setup of the benchmark's replicas: planned memory, the data, AUTO's engines settled."""
    sys.path.insert(0, ROOT)
    from layerforge.dataparallel.cpu_parallel import warm_up_replica

    solver.net.optimize_memory()
    fill_inputs(solver.net, solver.net.split)
    warm_up_replica(g, solver)


def choose_layerforge(net_name, requested, fuse_batch_norm=True, precision="fp32"):
    """The configuration layerforge train would use (AUTO: from the cache, or a trial stored there)."""
    sys.path.insert(0, ROOT)
    from layerforge.dataparallel.cpu_parallel import resolve

    choice = resolve(layerforge_solver_dict(net_name, fuse_batch_norm, precision=precision), requested=requested)
    return {"mode": choice.mode, "replicas": choice.replicas, "why": choice.why}


def run_layerforge(net_name, iterations, mode, replicas, fuse_batch_norm=True, precision="fp32"):
    sys.path.insert(0, ROOT)
    if mode == "REPLICAS":
        from layerforge.dataparallel.cgdp import train_parallel

        result = train_parallel(layerforge_solver_dict(net_name, fuse_batch_norm, precision=precision),
                                workers=replicas, sync="host",
                                chunk_size=1, split=True, setup=replica_setup, iterations=iterations + 1,
                                log=False)
        times = result.iteration_times[-iterations:]  # between the ends of two iterations' exchanges
        return {"times": times, "mode": mode, "replicas": replicas}
    from layerforge.dataparallel.cpu_parallel import iteration_times, warm_up

    solver = layerforge_solver(net_name, fuse_batch_norm, precision=precision)
    net = solver.net
    convs = [layer for layer in net.layers if hasattr(layer, "engine_choice")]
    warm = warm_up(solver, limit=10)
    times = iteration_times(solver, iterations)
    engines = {layer.name: "/".join(layer.engine_choice.values()) for layer in convs}
    return {"times": times, "mode": mode, "replicas": 1, "warmup": warm,
            "counted_peak_bytes": net.memory_report()["peak_bytes"], "engines": engines}


def run_torch(net_name, iterations, threads, precision="fp32"):
    import torch
    torch.set_num_threads(threads)
    shape, nodes = NETS[net_name]()
    batch = BATCH[net_name]
    model = torch_module(nodes, shape)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, shape[0], shape[1], shape[1], generator=g)
    y = torch.randint(0, shape[2], (batch,), generator=g)

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    step()
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"times": times, "warmup": 1}


def describe_machine(threads, repeats=5):
    """What the figures depend on, measured in this process (run it with the benchmark's environment): the CPU
    model and vector extensions, the BLAS libraries with their kernel architecture (threadpoolctl), the OpenBLAS
    pin, PyTorch's CPU capability, and the SGEMM rate (GFLOP/s, numpy float32 2048^3, best of ``repeats``)."""
    import numpy
    from threadpoolctl import threadpool_info, threadpool_limits

    model, flags = "?", []
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
    vector = sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))
    blas = [f"{i.get('internal_api')} {i.get('version')} ({i.get('prefix')}), kernel {i.get('architecture')}, "
            f"{i.get('num_threads')} threads" for i in threadpool_info() if i.get("user_api") == "blas"]
    a = numpy.random.default_rng(0).standard_normal((2048, 2048)).astype(numpy.float32)
    out, best = numpy.empty_like(a), float("inf")
    with threadpool_limits(threads, "blas"):
        numpy.matmul(a, a, out=out)
        for _ in range(repeats):
            t0 = time.perf_counter()
            numpy.matmul(a, a, out=out)
            best = min(best, time.perf_counter() - t0)
    try:
        import torch
        torch_cpu = f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}"
    except ImportError:
        torch_cpu = "torch not installed"
    pins = {v: os.environ[v] for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if v in os.environ}
    return {"cpu": model, "cores": os.cpu_count(), "vector_extensions": vector, "blas": blas,
            "openblas_pin": pins or None, "numpy": numpy.__version__, "torch": torch_cpu,
            "sgemm_gflops": 2 * 2048 ** 3 / best / 1e9, "threads": threads}


def machine_report(threads, repeats=5):
    """(:func:`describe_machine`'s dict, the lines to print above a table), measured in a subprocess with
    ``threads`` BLAS threads; the SGEMM rate is the best of ``repeats``."""
    env = dict(os.environ, **{v: str(threads) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "machine", "--threads", str(threads),
                          "--sgemm-repeats", str(repeats)],
                         capture_output=True, text=True, env=env, check=True).stdout
    machine = json.loads(out.strip().splitlines()[-1])
    return machine, [
        f"CPU: {machine['cpu']}, {machine['cores']} cores; vector extensions: {' '.join(machine['vector_extensions'])}",
        f"BLAS: {'; '.join(machine['blas'])}; OpenBLAS pin: {machine['openblas_pin'] or 'none'}; "
        f"numpy {machine['numpy']}; {machine['torch']}",
        f"SGEMM limit (numpy float32 2048^3, {threads} threads): {machine['sgemm_gflops']:.0f} GFLOP/s"]


def child(args):
    if args.child == "choose":
        result = choose_layerforge(args.net, args.cpu_parallel, not args.no_fuse, args.precision)
    elif args.child == "layerforge":
        result = run_layerforge(args.net, args.iterations, args.mode, args.replicas, not args.no_fuse,
                                args.precision)
    elif args.child == "machine":
        result = describe_machine(args.threads, args.sgemm_repeats)
    else:
        result = run_torch(args.net, args.iterations, args.threads, args.precision)
    print(json.dumps(result))


# --------------------------------------------------------------------------------------------------
# the parent: subprocesses, their memory, the table

def measure(framework, net, args, mode=None, replicas=1):
    sys.path.insert(0, ROOT)
    from layerforge.dataparallel.peak_memory import PeakMemory
    threads = 1 if mode == "REPLICAS" else args.threads  # the replicas' workers set their own (one each)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads))
    command = [sys.executable, os.path.abspath(__file__), "--child", framework, "--net", net,
               "--iterations", str(args.iterations), "--threads", str(threads), "--precision", args.precision] + \
        ["--no-fuse"] * args.no_fuse
    if framework == "layerforge":
        command += ["--mode", mode, "--replicas", str(replicas)]
    if framework == "choose":
        command += ["--cpu-parallel", args.cpu_parallel]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    memory = PeakMemory(proc.pid)
    out, err = proc.communicate()
    peak = memory.stop()
    if proc.returncode:
        raise RuntimeError(f"{framework} {net} failed:\n{err[-3000:]}")
    return dict(json.loads(out.strip().splitlines()[-1]), peak_bytes=peak)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="lenet,alexnet,resnet50,vgg16")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternate layerforge / torch subprocesses this many times (contention hits both alike)")
    parser.add_argument("--threads", type=int, default=2, help="PyTorch's threads, and the cores layerforge uses")
    parser.add_argument("--cpu-parallel", type=str.upper, default="AUTO", choices=("AUTO", "THREADS", "REPLICAS"),
                        help="layerforge's configuration (default: AUTO, what `layerforge train` uses)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--no-fuse", action="store_true",
                        help="layerforge nets with fuse_batch_norm: false (BatchNorm, Scale, ReLU one by one)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: layerforge's gemm_precision BF16 against PyTorch's bfloat16 autocast")
    parser.add_argument("--child", choices=("layerforge", "torch", "choose", "machine"), help=argparse.SUPPRESS)
    parser.add_argument("--net", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--sgemm-repeats", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    rows = []
    machine, lines = machine_report(args.threads)
    print("\n".join(lines) + f"; precision {args.precision}")
    print(f"load average before: {os.getloadavg()}")
    print("| net | batch | layerforge configuration | lf img/s median (best) | torch img/s median (best) "
          "| lf / torch img/s median (best) | lf peak MiB | torch peak MiB | lf / torch peak | GFLOP / iter "
          "| lf % SGEMM | torch % SGEMM | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for net in args.nets.split(","):
        choice = measure("choose", net, args)
        runs = {"layerforge": [], "torch": []}
        for _ in range(args.rounds):
            runs["layerforge"].append(measure("layerforge", net, args, choice["mode"], choice["replicas"]))
            runs["torch"].append(measure("torch", net, args))
        b = BATCH[net]
        lf_times = [t for r in runs["layerforge"] for t in r["times"]]
        tc_times = [t for r in runs["torch"] for t in r["times"]]
        lf, tc = b / median(lf_times), b / median(tc_times)
        lf_best, tc_best = b / min(lf_times), b / min(tc_times)
        lf_peak = max(r["peak_bytes"] for r in runs["layerforge"])
        tc_peak = max(r["peak_bytes"] for r in runs["torch"])
        load = os.getloadavg()
        config = "THREADS" if choice["mode"] == "THREADS" else f"REPLICAS x{choice['replicas']}"
        flops = 3 * forward_flops(net, b)  # a training iteration: forward, and backward's two products
        limit = machine["sgemm_gflops"] * 1e9
        row = {"net": net, "batch": b, "choice": choice, "layerforge_runs": runs["layerforge"],
               "torch_runs": runs["torch"], "layerforge_images_per_second": lf, "torch_images_per_second": tc,
               "ratio": lf / tc, "ratio_best": lf_best / tc_best, "layerforge_peak_bytes": lf_peak,
               "torch_peak_bytes": tc_peak, "load": load, "flops_per_iteration": flops,
               "layerforge_sgemm_fraction": flops * lf / b / limit, "torch_sgemm_fraction": flops * tc / b / limit}
        rows.append(row)
        print(f"| {net} | {b} | {config} | {lf:.2f} ({lf_best:.2f}) | {tc:.2f} ({tc_best:.2f}) "
              f"| {lf / tc:.2f} ({lf_best / tc_best:.2f}) | {lf_peak / 2**20:.0f} | {tc_peak / 2**20:.0f} "
              f"| {lf_peak / tc_peak:.2f} | {flops / 1e9:.1f} | {100 * row['layerforge_sgemm_fraction']:.0f}% "
              f"| {100 * row['torch_sgemm_fraction']:.0f}% | {load[0]:.2f} |", flush=True)
    print(f"load average after: {os.getloadavg()}")
    for row in rows:
        print(f"{row['net']}: layerforge {row['choice']['mode']} ({row['choice']['why']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "precision": args.precision, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
