"""The whole GPU check in one device call of under 10 minutes: install, GPU tests, LeNet, nets, conv shapes.

    python benchmarks/gpu_suite.py                  # on the device machine (one call; see docs/gpu.md)
    python benchmarks/gpu_suite.py --cpu-smoke      # here: the same orchestration on numpy, in seconds

Phases, in order, each in its own subprocess with its own time box (a phase that fails or runs out of
time records its error and the suite goes on; the boxes shrink so that the whole ends by ``--budget``
seconds, 570 by default):

1. ``install``: the wheels carried in ``.whl/`` (lmdb, mlxtend: the device image lacks them) with
   ``pip install --no-deps``, then ``pip install --no-deps -e .``.
2. ``info``: device name, cupy and torch versions.
3. ``tests``: the GPU test subset under pytest: tests/kernels and tests/layers (conftest's ``xp`` fixture
   adds cupy where a device is present, so every layer test runs on numpy and on cupy; test_gpu_net.py
   trains LeNet and a small ResNet 20 iterations on both and runs ``layerforge time --gpu 0``), the
   device feed, the Stopwatch, and CGDP with two workers sharing the GPU (``--devices 0,0``, host and tree).
4. ``lenet``: configs/lenet_solver.yaml with ``solver_mode: GPU`` (stopping early if its box runs
   short; ``lenet_iterations`` says how far it got); test accuracy and seconds. Iterations 10-14 are traced
   (layerforge.trace) with NVTX ranges and device spans: ``trace_spans``, ``trace_nvtx``, ``trace_device_spans``.
5. ``nets``: ResNet-50 b64, AlexNet b256, VGG-16 b32 training iterations (forward, backward, momentum
   SGD) in layerforge (cupy) and PyTorch (CUDA), strict fp32 and TF32: images/s and peak device memory
   (cupy's memory pool after the run; torch.cuda.max_memory_allocated); and layerforge in fp32 with its
   body replayed from CUDA graphs (precision ``fp32-graph``, layerforge.solvers.cuda_graph). Warm-up runs
   until every AUTO convolution has settled.
6. ``convs``: every distinct ResNet-50 / VGG-16 convolution shape, forward GFLOP/s of layerforge's
   engines (IM2COL, IMPLICIT, Winograd where eligible), of a Convolution layer with ``engine: AUTO`` once
   it has settled (``AUTO_engine``; the target: never 5% below the better engine) and of
   torch.nn.functional.conv2d, timed with CUDA events.

Writes ``benchmarks/results/gpu-<device>-<yyyymmdd>.json`` (``--out`` folder) with ``device``, ``cupy``,
``torch``, ``tests_passed``, ``tests_failed``, ``lenet_accuracy``, ``lenet_seconds``, ``nets`` (one
``{net, batch, precision, layerforge_img_s, torch_img_s, layerforge_peak_mib, torch_peak_mib}`` per run),
``convs`` and ``phases`` (seconds and error of each), and prints a summary line last.
``--cpu-smoke`` runs every phase small on numpy / torch CPU (no install), to test the orchestration.
"""
import argparse
import datetime
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

# phase -> (time box in seconds on the device, in --cpu-smoke)
BOXES = {"install": (45, 5), "info": (20, 30), "tests": (170, 60), "lenet": (60, 60), "nets": (185, 60),
         "convs": (60, 60)}
NET_RUNS = [("resnet50", 64), ("alexnet", 256), ("vgg16", 32)]
SMOKE_NET_RUNS = [("lenet", 8)]
PRECISIONS = ("fp32", "tf32")
RESERVE = 10  # seconds kept for writing the results
STARTED = time.perf_counter()  # this process's start (phase boxes count from the child's start)


# --------------------------------------------------------------------------------------------------
# phases: each runs in a child process and returns a JSON-able dict

def phase_install(smoke):
    if smoke:
        return {"skipped": "cpu smoke"}
    steps = []
    wheels = sorted(glob.glob(os.path.join(ROOT, ".whl", "*.whl")))
    if wheels:
        steps.append([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                      "--no-cache-dir", *wheels])
    steps.append([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                  "-e", ROOT])
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd[:6])} ...: {proc.stderr.strip()[-1500:]}")
    return {"wheels": [os.path.basename(w) for w in wheels]}


def phase_info(smoke):
    import torch
    info = {"torch": torch.__version__, "cupy": None, "device": "cpu-smoke" if smoke else None}
    if not smoke:
        import cupy
        info["cupy"] = cupy.__version__
        from layerforge.backend import gpu_name
        info["device"] = gpu_name(0)
    return info


def phase_tests(smoke):
    targets = ["tests/kernels/test_lrn.py"] if smoke else [
        "tests/kernels", "tests/layers", "tests/data/test_device_feed.py", "tests/test_backend.py",
        "tests/dataparallel/cgdp/test_host_tree.py::test_two_workers_sharing_one_gpu_match_one_cpu_worker_with_the_whole_batch"]
    import importlib.util
    if not smoke and importlib.util.find_spec("xdist"):  # the device image has pytest-xdist: 16 cores
        targets += ["-n", "8"]
    if importlib.util.find_spec("pytest_timeout"):
        targets += ["--timeout", "60"]
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "junit.xml")
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                               *targets], capture_output=True, text=True, cwd=ROOT)
        counts = {"tests_passed": 0, "tests_failed": 0, "tests_skipped": 0}
        if os.path.exists(report):
            for suite in ET.parse(report).getroot().iter("testsuite"):
                total, failed = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
                skipped = int(suite.get("skipped", 0))
                counts["tests_passed"] += total - failed - skipped
                counts["tests_failed"] += failed
                counts["tests_skipped"] += skipped
    failed_ids = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)
    counts["failed_tests"] = failed_ids[:50]
    counts["summary"] = (proc.stdout.strip().splitlines() or [""])[-1]
    return counts


def phase_lenet(smoke, seconds_left):
    """LeNet's solver on the GPU in chunks of 50 iterations, stopping early when its time box runs short."""
    import layerforge
    overrides = dict(snapshot_after_train=False, test_interval=0, display=0)
    if smoke:
        overrides.update(max_iter=20, test_iter=[1])
    else:
        overrides.update(solver_mode="GPU", device_id=0)
    solver = layerforge.get_solver(os.path.join(ROOT, "configs", "lenet_solver.yaml"), **overrides)
    from layerforge import trace
    trace_path = os.path.join(tempfile.mkdtemp(), "lenet-trace.json")
    # iterations 10-14 traced: NVTX ranges (Nsight) and device spans (CUDA events) on a GPU
    trace.start(trace_path, (10, 15), xp=solver.xp, device_spans=not smoke)
    t0 = time.perf_counter()
    stop = STARTED + 0.75 * seconds_left  # the box counts from process start; leave time for the test pass
    while solver.iter < solver.param.max_iter and time.perf_counter() < stop:
        solver.step(min(50, solver.param.max_iter - solver.iter))
    seconds = time.perf_counter() - t0
    rec = trace.current_recorder()
    trace.finish()
    scores = solver.test(0)
    doc = trace.load_trace(trace_path)
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    return {"lenet_accuracy": float(scores["accuracy"]), "lenet_seconds": seconds, "lenet_iterations": solver.iter,
            "trace_spans": len(spans), "trace_nvtx": rec.nvtx is not None,
            "trace_device_spans": sum(rows.get((e["pid"], e["tid"])) == "device" for e in spans)}


def _sync(xp):
    if xp.__name__ == "cupy":
        xp.cuda.Device().synchronize()


def _layerforge_run(net_name, batch, precision, iterations, smoke):
    import numpy
    from bench_train import NETS, layerforge_def
    from layerforge.net import Net

    from layerforge.solvers.cuda_graph import IterationGraphs
    from layerforge.layers.conv import engines_settled

    graph = precision.endswith("-graph")
    if smoke:
        xp = numpy
    else:
        import cupy as xp
        from layerforge.kernels.blas import set_gemm_precision
        set_gemm_precision(precision.split("-")[0])
        if graph:  # a graph is recorded on a stream of its own (kept alive here); everything runs there
            stream = xp.cuda.Stream(non_blocking=True)
            stream.use()
    shape, nodes = NETS[net_name]()
    net = Net(layerforge_def(nodes, batch, shape), xp=xp)
    graphs = None
    g = numpy.random.default_rng(0)
    net.blobs["data"].data[...] = xp.asarray(g.standard_normal(net.blobs["data"].shape), dtype=net.dtype)
    net.blobs["label"].data[...] = xp.asarray(g.integers(0, shape[2], batch), dtype=net.dtype)
    params = [(b, lr) for b, lr in zip(net.learnable_params, net.params_lr) if lr]
    history = [xp.zeros_like(b.data) for b, _ in params]

    def step():
        net.clear_param_diffs()
        if graphs is not None:
            graphs.forward_backward()
        else:
            net.forward()
            net.backward()
        for (b, lr_mult), v in zip(params, history):
            v *= 0.9
            v -= (1e-3 * lr_mult) * (b.diff + 5e-4 * b.data)
            b.data += v

    for k in range(12):  # warm-up: kernel compilation, AUTO's engine trials, memory pool growth
        step()
        if k >= 1 and engines_settled(net):
            break
    if graph:  # recorded at the first step (a stand-in recorder on numpy), replayed by the timed ones
        graphs = IterationGraphs(net, record=(lambda fn: fn) if smoke else None)
        step()
    _sync(xp)
    t0 = time.perf_counter()
    for _ in range(iterations):
        step()
    _sync(xp)
    seconds = (time.perf_counter() - t0) / iterations
    if graphs is not None and graphs.failed:
        raise RuntimeError(f"cuda_graph: {graphs.failed}")
    peak = xp.get_default_memory_pool().total_bytes() if xp is not numpy else 0
    return batch / seconds, peak / 2 ** 20


def _torch_run(net_name, batch, precision, iterations, smoke):
    import torch
    from bench_train import NETS, torch_module

    device = "cpu" if smoke else "cuda"
    if not smoke:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
        torch.cuda.reset_peak_memory_stats()
    shape, nodes = NETS[net_name]()
    model = torch_module(nodes, shape).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, shape[0], shape[1], shape[1], generator=gen).to(device)
    y = torch.randint(0, shape[2], (batch,), generator=gen).to(device)

    def step():
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(2):
        step()
    sync = (lambda: None) if smoke else torch.cuda.synchronize
    sync()
    t0 = time.perf_counter()
    for _ in range(iterations):
        step()
    sync()
    seconds = (time.perf_counter() - t0) / iterations
    peak = 0 if smoke else torch.cuda.max_memory_allocated()
    return batch / seconds, peak / 2 ** 20


def phase_net(smoke, framework, net, batch, precision):
    """One (framework, net, precision) run, in its own process so that device memory starts empty."""
    iterations = 1 if smoke else 5
    run = _layerforge_run if framework == "layerforge" else _torch_run
    img_s, peak_mib = run(net, batch, precision, iterations, smoke)
    return {"img_s": img_s, "peak_mib": peak_mib}


def phase_convs(smoke):
    import numpy
    import torch
    from bench_conv import conv_shapes
    from layerforge.kernels.output_size import conv_output_size
    from layerforge.kernels.implicit_gemm import ENGINES
    from layerforge.kernels.winograd import eligible

    batch, repeat = (1, 1) if smoke else (32, 5)
    if smoke:
        import numpy as xp
        shapes = dict(list(conv_shapes("lenet").items())[:1])
        device = "cpu"
    else:
        import cupy as xp
        shapes = {**conv_shapes("resnet50"), **conv_shapes("vgg16")}
        device = "cuda"
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

    def timed(fn):
        fn()
        if smoke:
            t0 = time.perf_counter()
            for _ in range(repeat):
                fn()
            return (time.perf_counter() - t0) / repeat
        start, end = xp.cuda.Event(), xp.cuda.Event()
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        return xp.cuda.get_elapsed_time(start, end) / 1e3 / repeat

    rows = []
    rng = numpy.random.default_rng(0)
    for (cin, s, cout, k, stride, pad, group), count in shapes.items():
        o = conv_output_size(s, k, stride, pad)
        x = xp.asarray(rng.standard_normal((batch, cin, s, s), dtype=numpy.float32))
        W = xp.asarray(rng.standard_normal((cout, cin // group, k, k), dtype=numpy.float32) * 0.05)
        b = xp.zeros(cout, numpy.float32)
        y = xp.empty((batch, cout, o, o), numpy.float32)
        flops = 2.0 * batch * cout * o * o * (cin // group) * k * k
        row = {"shape": [cin, s, cout, k, stride, pad, group], "count": count, "batch": batch}
        for name, cls in ENGINES.items():
            if name.startswith("WINOGRAD") and not eligible((k, k, stride, stride, pad, pad, 1, 1)):
                continue
            engine = cls((k, k, stride, stride, pad, pad, 1, 1), group)
            row[name + "_gflop_s"] = flops / timed(lambda: engine.forward(x, W, b, y)) / 1e9
            engine.release()
        row["AUTO_engine"], row["AUTO_gflop_s"] = auto_forward(xp, x, (cout, k, stride, pad, group), flops, timed)
        xt, Wt, bt = (torch.as_tensor(numpy.asarray(a.get() if hasattr(a, "get") else a), device=device)
                      for a in (x, W, b))
        with torch.no_grad():
            row["torch_gflop_s"] = flops / timed(
                lambda: torch.nn.functional.conv2d(xt, Wt, bt, stride, pad, 1, group)) / 1e9
        rows.append(row)
    return {"convs": rows}


def auto_forward(xp, x, conv, flops, timed):
    """A Convolution layer with ``engine: AUTO`` on ``x``: the forward engine it settles on (timing with CUDA
    events on a GPU) and its forward GFLOP/s once settled, to set beside the engines' own figures."""
    import numpy
    from layerforge.blob import Blob
    from layerforge.layers import create_layer

    cout, k, stride, pad, group = conv
    layer = create_layer({"type": "Convolution", "bottom": "x", "top": "y", "convolution": {
        "num_output": cout, "kernel_size": k, "stride": stride, "pad": pad, "group": group, "engine": "AUTO",
        "weight_filler": {"type": "gaussian", "std": 0.05}}}, dtype=numpy.float32, xp=xp)
    bottom, top = [Blob(x.shape, numpy.float32, xp)], [Blob((), numpy.float32, xp)]
    bottom[0].data[...] = x
    layer.setup(bottom, top)
    for _ in range(20):  # warm-up and trial rounds of every engine
        if layer.engine_choice["forward"]:
            break
        layer.forward(bottom, top)
    return layer.engine_choice["forward"], flops / timed(lambda: layer.forward(bottom, top)) / 1e9


# --------------------------------------------------------------------------------------------------
# orchestration

def run_phase(name, args, timeout, smoke):
    """Run phase ``name`` (with ``args``) in a child process under ``timeout`` seconds: ``(result, error)``."""
    with tempfile.TemporaryDirectory() as tmp:
        result_file = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--phase", name, "--phase-args", json.dumps(args),
               "--result", result_file] + (["--cpu-smoke"] if smoke else [])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1, timeout), cwd=ROOT)
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout:.0f} s"
        if proc.returncode or not os.path.exists(result_file):
            tail = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
            return None, f"exit {proc.returncode}: {tail}"
        with open(result_file) as f:
            return json.load(f), None


def child(args):
    phase_args = json.loads(args.phase_args or "[]")
    fn = {"install": phase_install, "info": phase_info, "tests": phase_tests, "lenet": phase_lenet,
          "net": phase_net, "convs": phase_convs}[args.phase]
    result = fn(args.cpu_smoke, *phase_args)
    with open(args.result, "w") as f:
        json.dump(result, f)


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "unknown"


def suite(out_dir, budget, smoke, log=print):
    """Run every phase within ``budget`` seconds; write and return the results dict and its path."""
    deadline = time.monotonic() + budget
    results = {"device": None, "cupy": None, "torch": None, "tests_passed": 0, "tests_failed": 0,
               "lenet_accuracy": None, "lenet_seconds": None, "nets": [], "convs": [], "phases": {},
               "cpu_smoke": smoke, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}

    def box(name):
        return min(BOXES[name][1 if smoke else 0], deadline - time.monotonic() - RESERVE)

    def phase(name, key=None, args=(), timeout=None):
        t0 = time.monotonic()
        timeout = box(name) if timeout is None else timeout
        if timeout <= 1:
            result, error = None, "no time left"
        else:
            result, error = run_phase(name if key is None else "net", list(args), timeout, smoke)
        seconds = time.monotonic() - t0
        results["phases"][key or name] = {"seconds": round(seconds, 1), "error": error}
        log(f"[{key or name}] {seconds:6.1f} s  " + ("ok" if error is None else "ERROR " + error.splitlines()[-1][:200]))
        return result or {}

    phase("install")
    results.update({k: v for k, v in phase("info").items() if k in ("device", "cupy", "torch")})
    tests = phase("tests")
    results.update({k: tests[k] for k in ("tests_passed", "tests_failed", "tests_skipped", "failed_tests",
                                          "summary") if k in tests})
    results.update(phase("lenet", args=(box("lenet"),)))
    nets_end = time.monotonic() + box("nets")
    runs = [(net, batch, precision, framework) for net, batch in (SMOKE_NET_RUNS if smoke else NET_RUNS)
            for precision in PRECISIONS for framework in ("layerforge", "torch")]
    # with and without CUDA graphs: layerforge's fp32 iteration with its body replayed from a recorded graph
    runs += [(net, batch, "fp32-graph", "layerforge") for net, batch in (SMOKE_NET_RUNS if smoke else NET_RUNS)]
    rows = {}
    for i, (net, batch, precision, framework) in enumerate(runs):
        share = (nets_end - time.monotonic()) / (len(runs) - i)  # what is left, shared by the runs to go
        r = phase("nets", f"nets/{framework}/{net}/{precision}", (framework, net, batch, precision), timeout=share)
        row = rows.setdefault((net, precision), {"net": net, "batch": batch, "precision": precision})
        row[f"{framework}_img_s"] = r.get("img_s")
        row[f"{framework}_peak_mib"] = r.get("peak_mib")
    results["nets"] = list(rows.values())
    results.update(phase("convs"))
    os.makedirs(out_dir, exist_ok=True)
    day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")
    path = os.path.join(out_dir, f"gpu-{slug(results['device'])}-{day}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    errors = sum(1 for p in results["phases"].values() if p["error"])
    log(f"gpu suite: device {results['device']}, tests {results['tests_passed']} passed "
        f"{results['tests_failed']} failed, lenet accuracy {results['lenet_accuracy']}, "
        f"{len(results['nets'])} net rows, {len(results['convs'])} conv shapes, {errors} phase errors -> {path}")
    return results, path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"), help="folder for the JSON")
    parser.add_argument("--budget", type=float, default=570, help="seconds for the whole suite")
    parser.add_argument("--cpu-smoke", "--dry-run", action="store_true", dest="cpu_smoke",
                        help="every phase small, on numpy and torch CPU, no install")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--phase-args", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:
        child(args)
        return 0
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    suite(args.out, args.budget, args.cpu_smoke, log=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
