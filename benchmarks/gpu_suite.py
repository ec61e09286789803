"""The whole GPU check in one device call of under 10 minutes: install, GPU tests, LeNet, nets, kernels, data, convs.

    python benchmarks/gpu_suite.py                  # on the device machine (docs/gpu.md: in two calls, --phases)
    python benchmarks/gpu_suite.py --emulated       # here: the device code of every phase, small, on the emulated GPU
    python benchmarks/gpu_suite.py --cpu-smoke      # here: the same orchestration on numpy, in seconds

Phases, in order, each in its own subprocess with its own time box (a phase that fails or runs out of
time records its error and the suite goes on; the boxes shrink so that the whole ends by ``--budget``
seconds, 570 by default):

1. ``install``: the wheels carried in ``.whl/`` (lmdb, mlxtend: the device image lacks them) with
   ``pip install --no-deps``, then ``pip install --no-deps -e .``.
2. ``info``: device name, cupy and torch versions.
3. ``tests``: the GPU tests under pytest, ``-m "gpu and not mpi"`` (conftest marks every test that touches the
   device; the ``xp`` fixture's cupy cases run on the GPU; test_gpu_net.py trains LeNet and a small ResNet 20
   iterations on both and runs ``layerforge time --gpu 0``; the device feed, the Stopwatch, CGDP with two workers
   sharing the GPU, CUDA graphs, ...), without the emulator's own tests and this suite's emulated run; one device
   and no mpiexec in the device image, so no MPI test. A run stopped at its box counts what its -v lines show.
4. ``lenet``: configs/lenet_solver.yaml with ``solver_mode: GPU`` (stopping early if under half of its box is
   left; ``lenet_iterations`` says how far it got); test accuracy and seconds; then the same on the CPU (numpy, one
   process) for as many iterations, in the rest of the box: ``lenet_cpu_accuracy``, ``lenet_cpu_iterations``.
   Iterations 10-14 are traced (layerforge.trace) with NVTX ranges and device spans: ``trace_spans``,
   ``trace_nvtx``, ``trace_device_spans``.
5. ``nets``: ResNet-50 b64, AlexNet b256, VGG-16 b32 training iterations (forward, backward, momentum
   SGD) in layerforge (cupy) and PyTorch (CUDA), strict fp32 and TF32, and ResNet-50 in bf16 (layerforge's
   bf16 products, ``gemm_precision``; PyTorch's bf16 autocast): images/s and peak device memory
   (cupy's memory pool after the run; torch.cuda.max_memory_allocated); and layerforge in fp32 with its
   body replayed from CUDA graphs (precision ``fp32-graph``, layerforge.solvers.cuda_graph). Warm-up runs
   until every AUTO convolution has settled.
6. ``kernels``: every CUDA kernel and the GEMM in each precision on benchmarks/gpu_kernels.py's fixed inputs, the
   outputs saved beside the results (``kernels-<device>-<yyyymmdd>.npz``) for ``gpu_kernels.py --against`` to
   compare with the emulated device's here.
7. ``sanitize``: compute-sanitizer's memcheck and racecheck over the CUDA kernels' GPU tests
   (``SANITIZE_TARGETS``, cupy's memory pool off so that memcheck sees each array's end): errors, hazards,
   pytest's line and the first report lines of each.
8. ``ncu``: one Nsight Compute report (clocks left as found) of the implicit-GEMM forward kernel on ResNet-50's
   res3 3x3 convolution, batch 32 (``gpu_kernels.py --profile``), written beside the results; its metrics in them.
9. ``data``: the input pipeline feeding the GPU. Makes (once, under ``--scratch``, default data/gpu_suite/)
   1,024 ImageNet-like 500 x 375 JPEGs in an encoded Datum LMDB (bench_data.py's ``make_set``); checks that a
   Data layer on the device (uint8 crops copied over, mean and scale applied there) gives the tops numpy gives
   on the host (3 batches, mean_value with scale and mean_file); then trains the zoo's ResNet-50
   (configs/resnet50_net.yaml, batch 64) twice, fed by a Data layer over the LMDB (the `real` stage: crop 224,
   mirror, mean values, one decode worker per core) and by its synthetic default: images/s of each, the data
   wait per iteration and the verdict ``input_bound`` (the Data layer's InputStats), and the decode workers'
   rate with the net idle (the data layer's forwards alone).
10. ``convs``: every distinct ResNet-50 / VGG-16 convolution shape, forward GFLOP/s of layerforge's
   engines (IM2COL, IMPLICIT, Winograd where eligible), of a Convolution layer with ``engine: AUTO`` once
   it has settled (``AUTO_engine``; the target: never 5% below the better engine) and of
   torch.nn.functional.conv2d, timed with CUDA events.

Writes ``benchmarks/results/gpu-<device>-<yyyymmdd>.json`` (``--out`` folder) with ``device``, ``cupy``,
``torch``, ``tests_passed``, ``tests_failed``, ``lenet_accuracy``, ``lenet_seconds``, ``nets`` (one
``{net, batch, precision, layerforge_img_s, torch_img_s, layerforge_peak_mib, torch_peak_mib, layerforge_iterations,
torch_iterations, layerforge_settled}`` per run),
``kernels_file``, ``kernels_outputs``, ``sanitizer`` (``memcheck`` and ``racecheck``: ``errors``, ``hazards``,
``pytest``, ``report``, ...), ``ncu_report``, ``ncu_launch``, ``ncu_summary``, ``ncu_metrics``, ``data_pipeline``
(``lmdb_img_s``, ``synthetic_img_s``, ``wait_ms_per_iteration``, ``input_bound``, ``pipeline_img_s``,
``feed_matches``, ...; docs/gpu.md), ``convs`` and ``phases`` (seconds and error of each), and prints a summary
line last. Where compute-sanitizer or ncu is missing, their phases record an error on a device and nothing in the
small modes.
``--cpu-smoke`` runs every phase small on numpy / torch CPU (no install), to test the orchestration; its data
phase: 32 JPEGs of 64 x 48 and CIFAR-10 quick at batch 8, crop 32, two iterations. ``--emulated`` runs the same small
settings through every phase's device code (cupy, CUDA events, graphs, the device data feed) on layerforge's emulated
CUDA device (its children get ``LAYERFORGE_EMULATED_GPU=1``), without PyTorch (its CUDA cannot be emulated, and
``--cpu-smoke`` runs its CPU code): it checks that the code runs; its figures mean nothing.
"""
import argparse
import datetime
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

MODES = ("device", "cpu-smoke", "emulated")
# phase -> time box in seconds in each of MODES
BOXES = {"install": (30, 5, 5), "info": (15, 30, 30), "tests": (120, 60, 90), "lenet": (50, 60, 120),
         "nets": (160, 60, 180), "kernels": (15, 30, 60), "sanitize": (80, 60, 120), "ncu": (25, 30, 60),
         "data": (40, 90, 150), "convs": (25, 60, 90)}
NET_RUNS = [("resnet50", 64), ("alexnet", 256), ("vgg16", 32)]
SMOKE_NET_RUNS = [("lenet", 8)]
# bf16 runs (layerforge's bf16 products against PyTorch's bf16 autocast): the net of the target only
BF16_NET_RUNS, SMOKE_BF16_NET_RUNS = [("resnet50", 64)], [("lenet", 8)]
# the CUDA kernels' GPU tests that compute-sanitizer's memcheck and racecheck run (small: one test of each file)
SANITIZE_TARGETS = ["tests/kernels/test_gpu_kernels.py", "tests/kernels/test_fused_batch_norm.py"]
SMOKE_SANITIZE_TARGETS = ["tests/kernels/test_gpu_kernels.py::test_lrn",
                          "tests/kernels/test_fused_batch_norm.py::test_only_what_is_asked_for_is_written"]
SANITIZER_TOOLS = ("memcheck", "racecheck")
SANITIZER_ERRORS = 99  # compute-sanitizer's exit status when it reports an error (pytest's own stay below 6)
# pytest in a process whose cupy allocates every array with its own cudaMalloc: memcheck sees the end of each array
# (cupy's pool hands out pieces of larger blocks, inside which an access past an array's end is not reported)
SANITIZED_PYTEST = ("import sys, layerforge, cupy; cupy.cuda.set_allocator(None); "
                    "import pytest; sys.exit(pytest.main(sys.argv[1:]))")
# Nsight Compute on the implicit-GEMM forward (benchmarks/gpu_kernels.py --profile): its sections, and the metrics of
# the report that go into the results' summary
NCU_SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis")
NCU_SUMMARY = ("Duration", "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput", "Achieved Occupancy",
               "Registers Per Thread", "Theoretical Occupancy")
# the data phase: (images, width, height, classes) of its JPEG set, and (zoo net, batch, crop) it trains
DATA_SET, SMOKE_DATA_SET = (1024, 500, 375, 1000), (32, 64, 48, 10)
DATA_NET, SMOKE_DATA_NET = ("resnet50", 64, 224), ("cifar10_quick", 8, 32)
DATA_FEEDS = ("lmdb", "synthetic")
PRECISIONS = ("fp32", "tf32")  # every net; bf16: BF16_NET_RUNS
NET_WEIGHTS = {"resnet50": 2}  # the nets phase's time shared by weight: ResNet-50 (the target) twice
RESERVE = 10  # seconds kept for writing the results
STARTED = time.perf_counter()  # this process's start (phase boxes count from the child's start)
EMULATOR_ENV = "LAYERFORGE_EMULATED_GPU"  # what turns the emulated device on (layerforge_emulator)


class Mode:
    """How the suite runs (one of MODES): on a GPU ("device"), small on numpy ("cpu-smoke"), or small through the
    device code on the emulated GPU ("emulated")."""

    def __init__(self, name):
        if name not in MODES:
            raise ValueError(f"mode {name!r}: one of {', '.join(MODES)}")
        self.name = name
        self.small = name != "device"  # the smoke sizes
        self.gpu = name != "cpu-smoke"  # layerforge on cupy (a device or the emulated one)
        self.cuda = name == "device"  # torch on CUDA
        self.torch = name != "emulated"  # the PyTorch figures beside layerforge's (on its CPU in cpu-smoke)

    def env(self):
        """The environment of a phase's child process."""
        return dict(os.environ, **({EMULATOR_ENV: "1"} if self.name == "emulated" else {}))


# --------------------------------------------------------------------------------------------------
# phases: each runs in a child process and returns a JSON-able dict

def phase_install(mode):
    if mode.small:
        return {"skipped": mode.name}
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


def phase_info(mode):
    info = {"torch": None, "cupy": None, "device": None if mode.gpu else "cpu-smoke"}
    if mode.torch:
        import torch
        info["torch"] = torch.__version__
    if mode.gpu:
        from layerforge.backend import gpu_name  # first: layerforge puts the emulated device in cupy's place

        import cupy
        info["cupy"] = cupy.__version__
        info["device"] = gpu_name(0)
    return info


def outcomes_of_tests(output):
    """``{test id: outcome}`` from pytest's ``-v`` lines (with or without xdist), the last outcome of each id winning
    (an ERROR in teardown after PASSED): what a run stopped before its end had done."""
    outcomes = {}
    for line in output.splitlines():
        outcome = re.search(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line)
        test = re.search(r"(tests/\S+::\S+)", line)
        if outcome and test:
            outcomes[test.group(1)] = outcome.group(1)
    return outcomes


def phase_tests(mode, seconds):
    """The GPU tests (``-m "gpu and not mpi"``: one device, no mpiexec in the device image; the emulator's own tests
    and the suite's emulated run left out), 8 at a time. A run past the box is stopped a few seconds before it, and
    the tests it finished are counted (``tests_timed_out``)."""
    small = {"cpu-smoke": ["tests/kernels/test_lrn.py"], "emulated": ["tests/data/test_device_feed.py"]}
    targets = small[mode.name] if mode.small else [
        "tests", "--ignore=tests/emulator", "--ignore=tests/kernels/test_gpu_suite.py", "-m", "gpu and not mpi"]
    import importlib.util
    if not mode.small and importlib.util.find_spec("xdist"):  # the device image has pytest-xdist: 16 cores
        targets += ["-n", "8"]
    if importlib.util.find_spec("pytest_timeout"):
        targets += ["--timeout", "60"]
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "junit.xml")
        output, status = run_capturing([sys.executable, "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider",
                                        f"--junitxml={report}", *targets], STARTED + seconds - 5 - time.perf_counter(),
                                       mode.env())
        counts = {"tests_passed": 0, "tests_failed": 0, "tests_skipped": 0, "tests_timed_out": status is None}
        if os.path.exists(report):
            for suite in ET.parse(report).getroot().iter("testsuite"):
                total, failed = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
                skipped = int(suite.get("skipped", 0))
                counts["tests_passed"] += total - failed - skipped
                counts["tests_failed"] += failed
                counts["tests_skipped"] += skipped
    outcomes = outcomes_of_tests(output)
    if status is None:  # no report: what the lines say
        counts.update(tests_passed=sum(o in ("PASSED", "XFAIL") for o in outcomes.values()),
                      tests_failed=sum(o in ("FAILED", "ERROR", "XPASS") for o in outcomes.values()),
                      tests_skipped=sum(o == "SKIPPED" for o in outcomes.values()))
    failed_ids = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    failed_ids += [t for t, o in outcomes.items() if o in ("FAILED", "ERROR") and t not in failed_ids]
    counts["failed_tests"] = failed_ids[:50]
    counts["summary"] = (output.strip().splitlines() or [""])[-1]
    return counts


def lenet_solver(mode, gpu):
    """configs/lenet_solver.yaml's solver, on the GPU or the CPU (small: 6 iterations of batch 8, one test batch)."""
    import layerforge
    import yaml
    overrides = dict(snapshot_after_train=False, test_interval=0, display=0)
    if gpu:
        overrides.update(solver_mode="GPU", device_id=0)
    source = os.path.join(ROOT, "configs", "lenet_solver.yaml")
    if mode.small:
        with open(source) as f:
            source = {k: v for k, v in yaml.safe_load(f).items() if k != "net"}
        with open(os.path.join(ROOT, "configs", "lenet.yaml")) as f:
            source["net_param"] = yaml.safe_load(f)
        for layer in source["net_param"]["layers"]:
            if layer["type"] == "Data":
                layer["data"]["batch_size"] = 8
        overrides.update(max_iter=6, test_iter=[1])
    return layerforge.get_solver(source, **overrides)


def phase_lenet(mode, seconds_left):
    """LeNet's solver on the GPU in chunks of 50 iterations, stopping early when under half of its time box is left,
    then on the CPU (numpy, one process) for as many iterations, in what is left: the test accuracy of each."""
    solver = lenet_solver(mode, mode.gpu)
    from layerforge import trace
    trace_path = os.path.join(tempfile.mkdtemp(), "lenet-trace.json")
    # iterations 10-14 (3-4 when small) traced: NVTX ranges (Nsight) and device spans (CUDA events) on a GPU
    trace.start(trace_path, (3, 5) if mode.small else (10, 15), xp=solver.xp, device_spans=mode.gpu)
    t0 = time.perf_counter()
    stop = STARTED + 0.45 * seconds_left  # the box counts from process start; leave time for the CPU run
    while solver.iter < solver.param.max_iter and time.perf_counter() < stop:
        solver.step(min(50, solver.param.max_iter - solver.iter))
    seconds = time.perf_counter() - t0
    rec = trace.current_recorder()
    trace.finish()
    scores = solver.test(0)
    cpu, t0 = lenet_solver(mode, False), time.perf_counter()
    while cpu.iter < solver.iter and time.perf_counter() < STARTED + 0.9 * seconds_left:
        cpu.step(min(50, solver.iter - cpu.iter))
    cpu_seconds, cpu_scores = time.perf_counter() - t0, cpu.test(0)
    doc = trace.load_trace(trace_path)
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    return {"lenet_accuracy": float(scores["accuracy"]), "lenet_seconds": seconds, "lenet_iterations": solver.iter,
            "lenet_cpu_accuracy": float(cpu_scores["accuracy"]), "lenet_cpu_seconds": cpu_seconds,
            "lenet_cpu_iterations": cpu.iter, "trace_spans": len(spans), "trace_nvtx": rec.nvtx is not None,
            "trace_device_spans": sum(rows.get((e["pid"], e["tid"])) == "device" for e in spans)}


def _sync(xp):
    if xp.__name__ == "cupy":
        xp.cuda.Device().synchronize()


def _layerforge_run(net_name, batch, precision, iterations, mode, stops):
    import numpy
    from bench_train import NETS, layerforge_def
    from layerforge.net import Net

    from layerforge.solvers.cuda_graph import IterationGraphs
    from layerforge.kernels.autotune import engines_settled

    graph = precision.endswith("-graph")
    if not mode.gpu:
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

    warm_up_end, end = stops
    for k in range(12):  # warm-up: kernel compilation, AUTO's engine trials, memory pool growth
        step()
        if k >= 1 and engines_settled(net) or time.perf_counter() > warm_up_end:
            break
    if graph:  # recorded at the first step (a stand-in recorder on numpy), replayed by the timed ones
        graphs = IterationGraphs(net, record=None if mode.gpu else (lambda fn: fn))
        step()
    settled = engines_settled(net)
    seconds, done = timed_steps(step, lambda: _sync(xp), iterations, end)
    if graphs is not None and graphs.failed:
        raise RuntimeError(f"cuda_graph: {graphs.failed}")
    peak = xp.get_default_memory_pool().total_bytes() if xp is not numpy else 0
    return {"img_s": batch / seconds, "peak_mib": peak / 2 ** 20, "iterations": done, "warm_up": k + 1,
            "settled": settled}


def timed_steps(step, sync, iterations, end):
    """``(seconds per step, steps)``: up to ``iterations`` calls of ``step``, synchronised at both ends, fewer where
    the host clock passes ``end`` (at least one)."""
    sync()
    t0, done = time.perf_counter(), 0
    while done < iterations and (done == 0 or time.perf_counter() < end):
        step()
        done += 1
    sync()
    return (time.perf_counter() - t0) / done, done


def _torch_run(net_name, batch, precision, iterations, mode, stops):
    import torch
    from bench_train import NETS, torch_module

    device = "cuda" if mode.cuda else "cpu"
    if mode.cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
        torch.cuda.reset_peak_memory_stats()
    shape, nodes = NETS[net_name]()
    model = torch_module(nodes, shape).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, shape[0], shape[1], shape[1], generator=gen).to(device)
    y = torch.randint(0, shape[2], (batch,), generator=gen).to(device)

    # bf16: PyTorch's way to it, autocast (bf16 activations in its convolutions and products, fp32 weights and loss);
    # layerforge's bf16 rounds the products' operands and keeps float32 activations (kernels.blas)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16")

    def step():
        opt.zero_grad(set_to_none=False)
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    sync = torch.cuda.synchronize if mode.cuda else (lambda: None)
    seconds, done = timed_steps(step, sync, iterations, stops[1])
    peak = torch.cuda.max_memory_allocated() if mode.cuda else 0
    return {"img_s": batch / seconds, "peak_mib": peak / 2 ** 20, "iterations": done, "warm_up": 2}


def phase_net(mode, framework, net, batch, precision, seconds=None):
    """One (framework, net, precision) run, in its own process so that device memory starts empty: 5 timed
    iterations (1 when small), fewer where its ``seconds`` (counted from the process's start) run short: the
    warm-up stops at 60% of them (``settled``: whether AUTO had chosen every engine), the timed steps at 90%."""
    iterations = 1 if mode.small else 5
    run = _layerforge_run if framework == "layerforge" else _torch_run
    seconds = seconds or 600
    return run(net, batch, precision, iterations, mode, (STARTED + 0.6 * seconds, STARTED + 0.9 * seconds))


def phase_convs(mode, seconds=None):
    """Forward GFLOP/s of each engine, AUTO's choice and PyTorch for every distinct ResNet-50 / VGG-16 convolution
    shape, until 85% of ``seconds`` (counted from the process's start) has passed: ``convs_left`` shapes untimed."""
    import numpy
    from bench_conv import conv_shapes
    from layerforge.kernels.output_size import conv_output_size
    from layerforge.kernels.implicit_gemm import ENGINES
    from layerforge.kernels.autotune import WINOGRAD_TILES
    from layerforge.kernels.winograd import eligible

    batch, repeat = (1, 1) if mode.small else (32, 5)
    if mode.gpu:
        import cupy as xp
    else:
        import numpy as xp
    if mode.small:
        shapes = dict(list(conv_shapes("lenet").items())[:1])
    else:
        shapes = {**conv_shapes("resnet50"), **conv_shapes("vgg16")}
    device = "cuda" if mode.cuda else "cpu"
    if mode.torch:
        import torch
    if mode.cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

    def timed(fn):
        fn()
        if not mode.gpu:
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
        if seconds and time.perf_counter() > STARTED + 0.85 * seconds:
            break
        o = conv_output_size(s, k, stride, pad)
        x = xp.asarray(rng.standard_normal((batch, cin, s, s), dtype=numpy.float32))
        W = xp.asarray(rng.standard_normal((cout, cin // group, k, k), dtype=numpy.float32) * 0.05)
        b = xp.zeros(cout, numpy.float32)
        y = xp.empty((batch, cout, o, o), numpy.float32)
        flops = 2.0 * batch * cout * o * o * (cin // group) * k * k
        row = {"shape": [cin, s, cout, k, stride, pad, group], "count": count, "batch": batch}
        for name, cls in ENGINES.items():
            if name in WINOGRAD_TILES and not eligible((k, k, stride, stride, pad, pad, 1, 1), WINOGRAD_TILES[name]):
                continue
            engine = cls((k, k, stride, stride, pad, pad, 1, 1), group)
            row[name + "_gflop_s"] = flops / timed(lambda: engine.forward(x, W, b, y)) / 1e9
            engine.release()
        row["AUTO_engine"], row["AUTO_gflop_s"] = auto_forward(xp, x, (cout, k, stride, pad, group), flops, timed)
        if mode.torch:
            xt, Wt, bt = (torch.as_tensor(numpy.asarray(a.get() if hasattr(a, "get") else a), device=device)
                          for a in (x, W, b))
            with torch.no_grad():
                row["torch_gflop_s"] = flops / timed(
                    lambda: torch.nn.functional.conv2d(xt, Wt, bt, stride, pad, 1, group)) / 1e9
        rows.append(row)
    return {"convs": rows, "convs_left": len(shapes) - len(rows)}


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
# the kernels on silicon: their outputs for the comparison with the emulated device, the sanitizer, Nsight Compute

SANITIZER_PLACES = ("/usr/local/cuda/bin/compute-sanitizer", "/usr/local/cuda/compute-sanitizer/compute-sanitizer",
                    "/opt/nvidia/compute-sanitizer/compute-sanitizer")
NCU_PLACES = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu")


def today():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")


def find_tool(name, places, mode):
    """The path of the program ``name``: on the PATH, else the last match of ``places`` (glob patterns). Where there
    is none: an error on a device, None in the small modes (this machine has neither compute-sanitizer nor ncu)."""
    found = shutil.which(name)
    if found:
        return found
    for pattern in places:
        matches = sorted(glob.glob(pattern))
        if matches:
            return matches[-1]
    if mode.small:
        return None
    raise RuntimeError(f"no {name} on the PATH or in " + ", ".join(places))


def run_capturing(cmd, seconds, env):
    """``(output, exit status)`` of ``cmd`` (stdout and stderr together); a run past ``seconds`` is killed with every
    process it started (its status None, its output so far kept)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
                            start_new_session=True)
    try:
        return proc.communicate(timeout=max(1.0, seconds))[0], proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()[0], None


def phase_kernels(mode, out_dir):
    """Every CUDA kernel, and the GEMM in each precision, on benchmarks/gpu_kernels.py's fixed inputs: the outputs go
    to ``kernels-<device>-<yyyymmdd>.npz`` in ``out_dir``, for ``gpu_kernels.py --against`` to compare with the
    emulated device's (docs/gpu.md). On numpy in cpu-smoke."""
    import numpy
    import gpu_kernels

    if mode.gpu:
        from layerforge.backend import gpu_name  # first: layerforge puts the emulated device in cupy's place

        import cupy as xp
        device = gpu_name(0)
    else:
        xp, device = numpy, "cpu-smoke"
    t0 = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"kernels-{slug(device)}-{today()}.npz")
    count = gpu_kernels.save(path, xp, device)
    return {"kernels_file": os.path.basename(path), "kernels_outputs": count,
            "kernels_seconds": time.perf_counter() - t0}


def sanitizer_report(output, status):
    """What one compute-sanitizer run of pytest says: its errors (ERROR SUMMARY, summed over processes), racecheck's
    hazards, pytest's last line, and the sanitizer's own report lines (the first 40)."""
    errors = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", output)]
    hazards = [int(n) for n in re.findall(r"RACECHECK SUMMARY: (\d+) hazard", output)]
    results = re.findall(r"^=*\s*(\d+ (?:passed|failed|errors?|skipped|deselected)\b.*?)\s*=*$", output, re.M)
    report = [line for line in output.splitlines() if line.startswith("=========")][:40]
    return {"exit": status, "timed_out": status is None, "errors": sum(errors) if errors else None,
            "hazards": sum(hazards) if hazards else None, "pytest": results[-1] if results else None,
            "report": report, "reported_error": status == SANITIZER_ERRORS or bool(sum(errors) + sum(hazards))}


def phase_sanitize(mode, seconds):
    """compute-sanitizer's memcheck and racecheck over the CUDA kernels' GPU tests (``SANITIZE_TARGETS``), each with
    half of what is left of the box; cupy's memory pool is off in them (``SANITIZED_PYTEST``). Where there is no
    compute-sanitizer: an error on a device, nothing in the small modes."""
    tool = find_tool("compute-sanitizer", SANITIZER_PLACES, mode)
    if tool is None:
        return {"sanitizer": None}
    targets = SMOKE_SANITIZE_TARGETS if mode.small else SANITIZE_TARGETS
    out = {"sanitizer": tool}
    for i, name in enumerate(SANITIZER_TOOLS):
        left = (STARTED + seconds - 3 - time.perf_counter()) / (len(SANITIZER_TOOLS) - i)
        cmd = [tool, "--tool", name, "--target-processes", "all", "--error-exitcode", str(SANITIZER_ERRORS),
               "--print-limit", "20", sys.executable, "-c", SANITIZED_PYTEST, "-q", "-p", "no:cacheprovider",
               "-p", "no:xdist", "-m", "gpu", *targets]
        out[name] = sanitizer_report(*run_capturing(cmd, left, mode.env()))
    return out


def ncu_metrics(csv_text):
    """``{"Section: Metric (unit)": value}`` from ``ncu --import R --csv --page details`` (one kernel launch), the
    kernel's name, block and grid, and the metrics of ``NCU_SUMMARY`` alone (keyed alike)."""
    import csv

    rows = list(csv.DictReader(line for line in csv_text.splitlines() if line.startswith('"')))
    metrics, summary = {}, {}
    for row in rows:
        if not row.get("Metric Name"):  # a rule's advice, not a metric
            continue
        unit = f" ({row['Metric Unit']})" if row.get("Metric Unit") else ""
        key = f"{row['Section Name']}: {row['Metric Name']}{unit}"
        metrics[key] = row["Metric Value"]
        if row["Metric Name"] in NCU_SUMMARY:
            summary[key] = row["Metric Value"]
    launch = {k: rows[0].get(k) for k in ("Kernel Name", "Block Size", "Grid Size", "Device")} if rows else {}
    return metrics, launch, summary


def phase_ncu(mode, out_dir, seconds):
    """One Nsight Compute report (``NCU_SECTIONS``, clocks left as found) of the implicit-GEMM forward kernel on
    ResNet-50's res3 3x3 convolution (gpu_kernels.py --profile), written to ``out_dir``; its metrics in the
    results. Where there is no ncu: an error on a device, nothing in the small modes."""
    from gpu_kernels import PROFILE_BATCH

    tool = find_tool("ncu", NCU_PLACES, mode)
    if tool is None:
        return {"ncu": None}
    os.makedirs(out_dir, exist_ok=True)
    report = os.path.join(out_dir, f"ncu-implicit-gemm-forward-{today()}")
    sections = [a for name in NCU_SECTIONS for a in ("--section", name)]
    cmd = [tool, "--clock-control", "none", "--target-processes", "all", "--kernel-name", "conv_forward",
           "--launch-skip", "1", "--launch-count", "1", *sections, "--export", report, "--force-overwrite",
           sys.executable, os.path.join(ROOT, "benchmarks", "gpu_kernels.py"), "--profile",
           "--batch", str(1 if mode.small else PROFILE_BATCH)]
    output, status = run_capturing(cmd, STARTED + 0.8 * seconds - time.perf_counter(), mode.env())
    if status != 0 or not os.path.exists(report + ".ncu-rep"):
        raise RuntimeError(f"ncu: exit {status}: {output.strip()[-1500:]}")
    csv_text, status = run_capturing([tool, "--import", report + ".ncu-rep", "--csv", "--page", "details"],
                                     STARTED + seconds - 2 - time.perf_counter(), mode.env())
    if status != 0:
        raise RuntimeError(f"ncu --import: exit {status}: {csv_text.strip()[-1500:]}")
    metrics, launch, summary = ncu_metrics(csv_text)
    return {"ncu": tool, "ncu_report": os.path.basename(report) + ".ncu-rep", "ncu_launch": launch,
            "ncu_summary": summary, "ncu_metrics": metrics}


# --------------------------------------------------------------------------------------------------
# the data pipeline: JPEG records decoded by the workers, uint8 crops to the device, against synthetic data

def phase_data_set(mode, scratch):
    """The ImageNet-like encoded-JPEG Datum LMDB (bench_data's), made once under ``scratch`` (None: ``gpu_suite``
    in layerforge's data folder, gitignored)."""
    from bench_data import make_set
    from layerforge.data import data_dir

    scratch = scratch or os.path.join(data_dir(), "gpu_suite")
    count, width, height, classes = SMOKE_DATA_SET if mode.small else DATA_SET
    t0 = time.perf_counter()
    db, jpeg_bytes = make_set(os.path.join(scratch, f"{count}-{width}x{height}"), count, height, width,
                              os.cpu_count(), classes)
    return {"db": db, "images": count, "image_size": [width, height], "jpeg_kib": jpeg_bytes / 1024,
            "set_seconds": time.perf_counter() - t0}


def data_layer(db, batch, transform, **data):
    """A TRAIN Data layer's definition over ``db``: shuffled, ``transform`` (crop, mirror, mean, scale)."""
    return {"name": "data", "type": "Data", "top": ["data", "label"], "transform": transform,
            "data": {"source": db, "batch_size": batch, **data}}


def phase_data_check(mode, db):
    """The Data layer's tops on the device (uint8 crops copied over, mean and scale applied there) against the
    same batches finished on the host by numpy, for a mean_value with a scale and for a mean_file (cropped and
    mirrored with each image): equal to float rounding. Both layers draw their batches from one seed."""
    if not db:
        raise RuntimeError("no data set (data/set failed)")
    import numpy
    from bench_data import MEAN
    from layerforge import rng
    from layerforge.blob import Blob
    from layerforge.layers import create_layer

    if mode.gpu:
        import cupy as xp
    else:
        xp = numpy
    _, width, height, _ = SMOKE_DATA_SET if mode.small else DATA_SET
    crop, batches = (SMOKE_DATA_NET if mode.small else DATA_NET)[2], 3
    mean_file = os.path.join(os.path.dirname(db), "mean.npy")
    numpy.save(mean_file, numpy.random.default_rng(0).uniform(0, 255, (3, height, width)).astype(numpy.float32))
    transforms = {"mean_value": {"crop_size": crop, "mirror": True, "mean_value": list(MEAN), "scale": 0.017},
                  "mean_file": {"crop_size": crop, "mirror": True, "mean_file": mean_file}}

    def tops(module, transform):
        rng.seed(0)
        layer = create_layer(data_layer(db, 8, transform, decode_workers=2), xp=module)
        top = [Blob((), numpy.float32, module), Blob((), numpy.float32, module)]
        layer.setup([], top)
        out = []
        for _ in range(batches):
            layer.forward([], top)
            out.append([numpy.asarray(t.data.get() if hasattr(t.data, "get") else t.data).copy() for t in top])
        layer.close()
        return out

    worst, labels_equal = {}, True
    for name, transform in transforms.items():
        host, device = tops(numpy, transform), tops(xp, transform)
        worst[name] = max(float(numpy.abs(d[0] - h[0]).max() / max(1.0, numpy.abs(h[0]).max()))
                          for h, d in zip(host, device))
        labels_equal &= all(numpy.array_equal(h[1], d[1]) for h, d in zip(host, device))
    return {"feed_batches": batches, "feed_max_rel_diff": worst, "feed_labels_equal": labels_equal,
            "feed_matches": labels_equal and max(worst.values()) <= 1e-6}


def zoo_data_net(name, db, batch, crop):
    """The zoo net ``name`` as a dict, its synthetic default at ``batch`` images of ``crop`` squares, and its
    `real` stage's TRAIN data layer made a Data layer over ``db`` when given (crop, mirror, the ImageNet mean
    values; ``decode_workers`` left at its default, one per core)."""
    import yaml
    from bench_data import MEAN

    with open(os.path.join(ROOT, "configs", f"{name}_net.yaml")) as f:
        net = yaml.safe_load(f)
    for i, layer in enumerate(net["layers"]):
        if layer.get("exclude") == {"stage": "real"}:
            layer["synthetic_data"] = dict(layer["synthetic_data"], batch_size=batch, shape=[3, crop, crop])
        elif layer.get("include") == {"phase": "TRAIN", "stage": "real"} and db:
            transform = {"crop_size": crop, "mirror": True, "mean_value": list(MEAN)}
            net["layers"][i] = dict(data_layer(db, batch, transform), name=layer["name"], top=layer["top"],
                                    include=layer["include"])
    return net


def phase_data_train(mode, feed, db, seconds):
    """The zoo net (ResNet-50, batch 64) trained by its solver's rule on the GPU, fed by the Data layer over the
    LMDB (``feed`` "lmdb", the `real` stage) or by the zoo's SyntheticData ("synthetic"): images/s, the host time
    the data layer's forward takes per iteration and, for the LMDB, its InputStats over the timed iterations
    (data wait) and the decode workers' rate with nothing else running (the data layer's forwards alone)."""
    if feed == "lmdb" and not db:
        raise RuntimeError("no data set (data/set failed)")
    import yaml
    import layerforge
    from layerforge.kernels.autotune import engines_settled
    from layerforge.layers.data import input_stats, reset_input_stats

    name, batch, crop = SMOKE_DATA_NET if mode.small else DATA_NET
    with open(os.path.join(ROOT, "configs", f"{name}.yaml")) as f:
        rule = {k: v for k, v in yaml.safe_load(f).items() if k in ("type", "base_lr", "momentum", "weight_decay")}
    solver = layerforge.get_solver({
        **rule, "net_param": zoo_data_net(name, db, batch, crop), "lr_policy": "fixed", "max_iter": 10 ** 6,
        "display": 0, "snapshot": 0, "snapshot_after_train": False, "test_interval": 0, "random_seed": 0,
        "solver_mode": "GPU" if mode.gpu else "CPU", "device_id": 0,
        "train_state": {"stage": ["real"] if feed == "lmdb" else []}})
    net, xp = solver.net, solver.xp
    layer = net.layers[0]
    assert layer.type == ("Data" if feed == "lmdb" else "SyntheticData"), layer.type
    forward, spent = layer.forward, [0.0]

    def timed_forward(bottom, top):  # the host time of the data layer's forward: waits, making, launches
        t0 = time.perf_counter()
        forward(bottom, top)
        spent[0] += time.perf_counter() - t0

    layer.forward = timed_forward
    stop = STARTED + 0.85 * seconds  # the box counts from process start
    warmup, (least, most) = 0, ((1, 1) if mode.small else (3, 12))
    while warmup < most and (warmup < least or time.perf_counter() < STARTED + 0.5 * seconds):
        solver.step(1)  # kernel compilation, AUTO's engine trials, the memory pool, the workers' first batches
        warmup += 1
        if warmup >= least and engines_settled(net):
            break
    _sync(xp)
    reset_input_stats(net)
    spent[0], iterations, t0 = 0.0, 0, time.perf_counter()
    while iterations < (2 if mode.small else 40) and (iterations < 2 or time.perf_counter() < stop - 5):
        solver.step(1)
        iterations += 1
    _sync(xp)
    seconds_timed = time.perf_counter() - t0
    result = {"img_s": iterations * batch / seconds_timed, "iterations": iterations, "warmup_iterations": warmup,
              "data_layer_ms": 1e3 * spent[0] / iterations}
    if feed == "lmdb":
        stats = input_stats(net)
        result.update(input=stats.as_dict(), wait_ms=1e3 * stats.wait_s / iterations, input_bound=stats.input_bound(),
                      decode_capacity_img_s=stats.capacity, input_summary=stats.summary())
        top = net.top_blobs(0)
        for _ in range(layer.prefetch):  # the batches made ahead while the net computed: the clock starts after
            forward([], top)
        drained, t0 = 0, time.perf_counter()
        while drained < (2 if mode.small else 60) and time.perf_counter() < stop:
            forward([], top)
            drained += 1
        _sync(xp)
        result["pipeline_img_s"] = drained * batch / (time.perf_counter() - t0)
        layer.close()
    return result


# --------------------------------------------------------------------------------------------------
# orchestration

def data_phases(phase, end, mode, scratch):
    """The data phase's steps in turn, sharing the seconds left until ``end``: the set, the feed check, the
    training runs (``DATA_FEEDS``). Returns the results' ``data_pipeline``."""
    def left():
        return end - time.monotonic()

    made = phase("data", "data/set", (scratch,), 0.5 * left(), "data_set")
    net, batch, crop = SMOKE_DATA_NET if mode.small else DATA_NET
    out = {k: made.get(k) for k in ("images", "image_size", "jpeg_kib", "set_seconds")}
    out.update(net=net, batch=batch, crop=crop)
    out.update(phase("data", "data/check", (made.get("db"),), 0.25 * left(), "data_check"))
    runs = {}
    for i, feed in enumerate(DATA_FEEDS):
        seconds = left() / (len(DATA_FEEDS) - i)
        runs[feed] = phase("data", f"data/{feed}", (feed, made.get("db"), seconds), seconds, "data_train")
    lmdb, synthetic = runs["lmdb"], runs["synthetic"]
    out.update({"lmdb_img_s": lmdb.get("img_s"), "synthetic_img_s": synthetic.get("img_s"),
                "wait_ms_per_iteration": lmdb.get("wait_ms"), "wait_share": lmdb.get("input", {}).get("wait_share"),
                "decode_workers": lmdb.get("input", {}).get("workers"),
                "decode_capacity_img_s": lmdb.get("decode_capacity_img_s"),
                "pipeline_img_s": lmdb.get("pipeline_img_s"), "input_bound": lmdb.get("input_bound"), "runs": runs})
    return out


def run_phase(name, args, timeout, mode):
    """Run phase ``name`` (with ``args``) in a child process under ``timeout`` seconds, in ``mode`` (a :class:`Mode`
    or its name): ``(result, error)``."""
    mode = mode if isinstance(mode, Mode) else Mode(mode)
    with tempfile.TemporaryDirectory() as tmp:
        result_file = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--phase", name, "--phase-args", json.dumps(args),
               "--result", result_file, "--mode", mode.name]
        # a phase past its box is stopped with every process it started (pytest's workers, compute-sanitizer, ...)
        output, status = run_capturing(cmd, timeout, mode.env())
        if status is None:
            return None, f"timed out after {timeout:.0f} s"
        if status or not os.path.exists(result_file):
            return None, f"exit {status}: {output.strip()[-2000:]}"
        with open(result_file) as f:
            return json.load(f), None


def child(args):
    phase_args = json.loads(args.phase_args or "[]")
    fn = {"install": phase_install, "info": phase_info, "tests": phase_tests, "lenet": phase_lenet,
          "net": phase_net, "data_set": phase_data_set, "data_check": phase_data_check,
          "data_train": phase_data_train, "convs": phase_convs, "kernels": phase_kernels,
          "sanitize": phase_sanitize, "ncu": phase_ncu}[args.phase]
    result = fn(Mode(args.mode), *phase_args)
    with open(args.result, "w") as f:
        json.dump(result, f)


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "unknown"


def suite(out_dir, budget, mode="device", log=print, scratch=None, phases=None):
    """Run every phase (or those of BOXES named in ``phases``) within ``budget`` seconds in ``mode`` (one of MODES);
    write and return the results dict and its path. The data phase makes its JPEG set under ``scratch`` (None:
    ``gpu_suite`` in layerforge's data folder, gitignored)."""
    if phases is not None:
        check_phases(phases)
    mode = Mode(mode)
    deadline = time.monotonic() + budget
    results = {"device": None, "cupy": None, "torch": None, "tests_passed": 0, "tests_failed": 0,
               "lenet_accuracy": None, "lenet_seconds": None, "nets": [], "data_pipeline": {}, "convs": [],
               "phases": {}, "mode": mode.name, "cpu_smoke": mode.name == "cpu-smoke",
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}

    def box(name):
        return min(BOXES[name][MODES.index(mode.name)], deadline - time.monotonic() - RESERVE)

    def phase(name, key=None, args=(), timeout=None, child=None):
        """Run child phase ``child`` (default ``name``) in ``timeout`` seconds (default: ``name``'s box), recorded
        under ``key`` (default ``name``)."""
        t0 = time.monotonic()
        if phases and name not in phases:
            results["phases"][key or name] = {"seconds": 0, "error": None, "skipped": True}
            return {}
        timeout = box(name) if timeout is None else min(timeout, box(name))
        if timeout <= 1:
            result, error = None, "no time left"
        else:
            result, error = run_phase(child or name, list(args), timeout, mode)
        seconds = time.monotonic() - t0
        results["phases"][key or name] = {"seconds": round(seconds, 1), "error": error}
        log(f"[{key or name}] {seconds:6.1f} s  " + ("ok" if error is None else "ERROR " + error.splitlines()[-1][:200]))
        return result or {}

    phase("install")
    results.update({k: v for k, v in phase("info").items() if k in ("device", "cupy", "torch")})
    tests = phase("tests", args=(box("tests"),))
    results.update({k: tests[k] for k in ("tests_passed", "tests_failed", "tests_skipped", "tests_timed_out",
                                          "failed_tests", "summary") if k in tests})
    results.update(phase("lenet", args=(box("lenet"),)))
    nets_end = time.monotonic() + box("nets")
    frameworks = ("layerforge", "torch") if mode.torch else ("layerforge",)
    runs = [(net, batch, precision, framework) for net, batch in (SMOKE_NET_RUNS if mode.small else NET_RUNS)
            for precision in PRECISIONS for framework in frameworks]
    runs += [(net, batch, "bf16", framework) for net, batch in (SMOKE_BF16_NET_RUNS if mode.small else BF16_NET_RUNS)
             for framework in frameworks]
    # with and without CUDA graphs: layerforge's fp32 iteration with its body replayed from a recorded graph
    runs += [(net, batch, "fp32-graph", "layerforge") for net, batch in (SMOKE_NET_RUNS if mode.small else NET_RUNS)]
    if phases and "nets" not in phases:
        runs = []
    rows = {}
    weights = [NET_WEIGHTS.get(net, 1) for net, *_ in runs]
    for i, (net, batch, precision, framework) in enumerate(runs):
        # what is left, shared by the runs to go by their weights
        share = (nets_end - time.monotonic()) * weights[i] / sum(weights[i:])
        r = phase("nets", f"nets/{framework}/{net}/{precision}", (framework, net, batch, precision, share), share,
                  "net")
        row = rows.setdefault((net, precision), {"net": net, "batch": batch, "precision": precision})
        row[f"{framework}_img_s"] = r.get("img_s")
        row[f"{framework}_peak_mib"] = r.get("peak_mib")
        row[f"{framework}_iterations"] = r.get("iterations")  # timed; fewer than 5 where the run's share ran short
        if framework == "layerforge":
            row["layerforge_settled"] = r.get("settled")  # AUTO had chosen every engine before the timed steps
    results["nets"] = list(rows.values())
    results.update(phase("kernels", args=(out_dir,)))
    results["sanitizer"] = phase("sanitize", args=(box("sanitize"),))
    results.update(phase("ncu", args=(out_dir, box("ncu"))))
    results["data_pipeline"] = data_phases(phase, time.monotonic() + box("data"), mode, scratch)
    results.update(phase("convs", args=(box("convs"),)))
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"gpu-{slug(results['device'])}-{today()}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    errors = sum(1 for p in results["phases"].values() if p["error"])
    log(f"gpu suite: device {results['device']}, tests {results['tests_passed']} passed "
        f"{results['tests_failed']} failed, lenet accuracy {results['lenet_accuracy']} after "
        f"{results.get('lenet_iterations')} iterations (CPU {results.get('lenet_cpu_accuracy')} after "
        f"{results.get('lenet_cpu_iterations')}), "
        f"{len(results['nets'])} net rows, {results.get('kernels_outputs')} kernel outputs saved, "
        f"{sanitizer_summary(results['sanitizer'])}, {ncu_duration(results)}, "
        f"{data_summary(results['data_pipeline'])}, "
        f"{len(results['convs'])} conv shapes, {errors} phase errors -> {path}")
    return results, path


def sanitizer_summary(sanitizer):
    """The sanitizer phase in a few words for the summary line."""
    if not sanitizer.get("sanitizer"):
        return "no sanitizer run"
    words = []
    for name in SANITIZER_TOOLS:
        run = sanitizer.get(name) or {}
        found = "timed out" if run.get("timed_out") else f"{run.get('errors')} errors"
        if name == "racecheck" and not run.get("timed_out"):
            found += f", {run.get('hazards')} hazards"
        words.append(f"{name} {found} ({run.get('pytest')})")
    return "; ".join(words)


def ncu_duration(results):
    """The profiled kernel's duration from the ncu phase's summary, in a few words."""
    for key, value in (results.get("ncu_summary") or {}).items():
        if ": Duration" in key:
            return f"ncu conv_forward {value} {key.rsplit('(', 1)[-1].rstrip(')')}"
    return "no ncu report"


def data_summary(data):
    """The data phase in a few words for the summary line."""
    def figure(key, unit=" img/s"):
        value = data.get(key)
        return "?" if value is None else f"{value:,.{1 if unit == ' ms' else 0}f}{unit}"

    return (f"data pipeline {data.get('net')} {figure('lmdb_img_s')} from the LMDB against "
            f"{figure('synthetic_img_s')} synthetic, waited {figure('wait_ms_per_iteration', ' ms')} an iteration, "
            f"decode {figure('pipeline_img_s')}, input_bound {data.get('input_bound')}, "
            f"device feed matches the host {data.get('feed_matches')}")


def check_phases(names):
    """``names`` when they are phases of BOXES (at least one), else ValueError."""
    if not names or any(name not in BOXES for name in names):
        raise ValueError(f"name phases of {', '.join(BOXES)}")
    return names


def phase_names(text):
    """``--phases``' value: comma-separated names of BOXES."""
    try:
        return check_phases([name for name in text.split(",") if name])
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


def main(argv=None):
    parser = argparse.ArgumentParser(prog=os.path.basename(__file__), description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"), help="folder for the JSON")
    parser.add_argument("--budget", type=float, default=570, help="seconds for the whole suite")
    parser.add_argument("--scratch", default=None,
                        help="folder for the data phase's JPEG set and LMDB (default: data/gpu_suite, gitignored)")
    small = parser.add_mutually_exclusive_group()
    small.add_argument("--cpu-smoke", "--dry-run", action="store_true", dest="cpu_smoke",
                       help="every phase small, on numpy and torch CPU, no install")
    small.add_argument("--emulated", action="store_true",
                       help="every phase small, through its device code on layerforge's emulated GPU (torch on its "
                            "CPU), no install: checks that the code runs; its figures mean nothing")
    parser.add_argument("--phases", type=phase_names, default=None,
                        help=f"run these phases alone, comma-separated (of {', '.join(BOXES)}); the others are skipped")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, default="device", help=argparse.SUPPRESS)
    parser.add_argument("--phase-args", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:
        child(args)
        return 0
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    mode = "cpu-smoke" if args.cpu_smoke else "emulated" if args.emulated else "device"
    suite(args.out, args.budget, mode, log=lambda line: print(line, flush=True), scratch=args.scratch,
          phases=args.phases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
