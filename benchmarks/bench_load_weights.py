"""What loading weights costs: time and peak memory of ``Net.copy_from`` against the net's parameter bytes.

    python benchmarks/bench_load_weights.py [--params-mib 64] [--unused-gib 3]

Writes a weights file of a net of InnerProduct layers holding ``--params-mib`` MiB of parameters, plus an entry
the net does not use: ``--unused-gib`` GiB of zeros, deflated (a few MiB on disk), as a file from elsewhere may
hold. A fresh process builds the net and loads the file; it prints the load's time and how much the process's
peak RSS grew (``resource.getrusage``), and that growth over the parameter bytes. Only the arrays the net needs
are decompressed (layerforge/npz.py), so the unused entry costs nothing; reading every entry first, as
``dict(numpy.load(path))`` does, would cost its whole size in memory.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTH = 1024  # each InnerProduct layer: WIDTH x WIDTH float32 weights (4 MiB) and a bias


def net_definition(params_mib, filler="gaussian"):
    layers = [{"name": "data", "type": "Input", "top": "x0", "input": {"shape": [[1, WIDTH]]}}]
    for i in range(max(1, int(params_mib) // 4)):
        layers.append({"name": f"ip{i}", "type": "InnerProduct", "bottom": f"x{i}", "top": f"x{i + 1}",
                       "inner_product": {"num_output": WIDTH, "weight_filler": {"type": filler, "std": 0.01}}})
    return {"name": "weights", "layers": layers}


def add_zeros_entry(path, name, nbytes):
    """Append entry ``name``: a float32 ``.npy`` of ``nbytes`` of zeros, deflated as it is written (no copy in memory)."""
    from numpy.lib import format as npy

    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open(f"{name}.npy", "w", force_zip64=True) as f:
            npy.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (nbytes // 4,)})
            block, left = bytes(1 << 24), nbytes // 4 * 4
            while left:
                f.write(block if left >= len(block) else block[:left])
                left -= min(left, len(block))


def write_weights(folder, params_mib, unused_bytes):
    """The net's definition (a JSON file) and its weights file with the unused entry; returns both paths."""
    sys.path.insert(0, ROOT)
    from layerforge import Net

    net_path, weights = os.path.join(folder, "net.json"), os.path.join(folder, "weights.npz")
    with open(net_path, "w") as f:  # the loading net: constant fillers, whose set-up needs no temporary arrays
        json.dump(net_definition(params_mib, "constant"), f)
    Net(net_definition(params_mib), phase="test").save(weights)
    if unused_bytes:
        add_zeros_entry(weights, "unused/0", unused_bytes)
    return net_path, weights


def peak_rss():
    """This process's peak resident memory in bytes: VmHWM, which counts from the process's exec (getrusage's
    ru_maxrss also keeps the peak of the process that started this one, as exec leaves it), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss():
    """Start counting the peak from now where Linux allows it (VmHWM back to the current RSS); returns the peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return peak_rss()


def measure(net_path, weights):
    """In this (fresh) process: build the net, load ``weights``; ``{params_bytes, seconds, rss_growth_bytes}``."""
    sys.path.insert(0, ROOT)
    from layerforge import Net

    with open(net_path) as f:
        net = Net(json.load(f), phase="test")
    params = sum(int(b.data.nbytes) for _, blobs in net.param_keys() for b in blobs)
    before = reset_peak_rss()
    start = time.perf_counter()
    net.copy_from(weights)
    seconds = time.perf_counter() - start
    after = peak_rss()
    return {"params_bytes": params, "seconds": seconds, "rss_growth_bytes": after - before,
            "checksum": float(sum(float(b.data.sum()) for _, blobs in net.param_keys() for b in blobs))}


def measure_in_child(net_path, weights):
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure", net_path, weights],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params-mib", type=int, default=64, help="the net's parameters, in MiB (default 64)")
    parser.add_argument("--unused-gib", type=float, default=3.0, help="zeros in the unused entry (default 3 GiB)")
    parser.add_argument("--measure", nargs=2, metavar=("NET", "WEIGHTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    with tempfile.TemporaryDirectory(prefix="bench_load_weights-") as folder:
        net_path, weights = write_weights(folder, args.params_mib, int(args.unused_gib * 2 ** 30))
        result = measure_in_child(net_path, weights)
        size = os.path.getsize(weights)
    mib = 2 ** 20
    print(f"weights file {size / mib:.1f} MiB ({args.unused_gib:g} GiB of zeros in an entry the net does not use); "
          f"parameters {result['params_bytes'] / mib:.1f} MiB")
    print(f"load: {result['seconds']:.2f} s, peak RSS grew {result['rss_growth_bytes'] / mib:.1f} MiB = "
          f"{result['rss_growth_bytes'] / result['params_bytes']:.2f} x the parameter bytes")


if __name__ == "__main__":
    main()
