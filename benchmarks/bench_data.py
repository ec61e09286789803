"""The image input pipeline: layerforge's Data layer beside PyTorch's DataLoader and beside the decode limit.

    python benchmarks/bench_data.py [--images 2000] [--workers 1,2] [--batches 40] [--repeats 3] [--quick] [--out DIR]

Makes, once, an ImageNet-like set under data/bench_data/ (gitignored): ``--images`` 500 x 375 JPEGs of about
73 KB (smooth colour fields with texture and noise, written by OpenCV at quality 88), put by ``layerforge
convert_imageset --encoded`` into a Datum LMDB. Then, for each worker count W, side by side:

* layerforge: a Data layer over the LMDB (TRAIN: shuffle, random crop 224, mirror, mean_value 104 117 123;
  batch 64; ``decode_workers`` W; default prefetch), its forward filling float32 tops;
* PyTorch: ``DataLoader(num_workers=W, batch_size=64, shuffle=True, persistent_workers=True)``, epoch after
  epoch, over a Dataset that reads the same
  records the same way (Datum parse, cv2.imdecode, random crop 224, mirror, mean) into float32 tensors;
* the limit: W times one core's cv2.imdecode rate over the same JPEGs, measured just before, in a process that
  keeps decoded images on malloc's heap as layerforge's workers do (``keep_images_on_the_heap``; glibc's default
  maps fresh pages for each 560 KB image and costs 1.3 instead of 0.8 ms a decode here).

Also the CPU milliseconds each pipeline spends per image, all its processes together (/proc), beside one
cv2.imdecode's: what the pipelines cost whatever share of the cores other work leaves them.

Images per second over ``--batches`` batches, after 6 warm-up batches (the workers' start and the batches they
prepare before the clock starts); each figure is the best of ``--repeats`` measurements taken in turns (the
limit, layerforge, PyTorch, again), as other work on a shared machine comes and goes. Each framework runs in its own subprocess per W (an LMDB environment is
opened once per process). A second table runs the Data layer with a device step after each forward (a sleep of
1.5 times the batch's decode time: the CPU stays free, as when a GPU computes) and prints the time the loop
waited for its batches (InputStats). A third shows why the workers are processes: decode rates of k threads
with the per-image capture of OpenCV's messages (one fd 2 per process: a lock), of k threads without it, and
of k forked processes that catch their own fd 2 once. ``--quick`` (CI): 48 images, batch 16, 3 batches, W = 1, 2, once,
the decode rates timed over 0.05 s (a pass over the 48 at least: the rows, not the figures, are what CI checks).
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
CROP, MEAN, WARMUP = 224, (104.0, 117.0, 123.0), 6


# --------------------------------------------------------------------------------------------------
# the data set

def imagenet_like(r, height=375, width=500):
    """A 500 x 375 BGR image that JPEG compresses like a photograph: smooth colour, texture, sensor noise."""
    import cv2

    base = cv2.resize(r.integers(0, 256, (12, 16, 3), dtype=numpy.uint8), (width, height),
                      interpolation=cv2.INTER_CUBIC).astype(numpy.float32)
    texture = cv2.resize(r.normal(0, 1, (height // 4, width // 4, 3)).astype(numpy.float32), (width, height))
    noise = r.normal(0, 1, (height, width, 3)).astype(numpy.float32)
    return numpy.clip(base + 28 * texture + 9 * noise, 0, 255).astype(numpy.uint8)


def write_image(job):
    """Write image ``index`` of set ``seed`` (its own random stream: any worker makes the same file) as a JPEG."""
    import cv2

    path, seed, index, height, width = job
    image = imagenet_like(numpy.random.default_rng([seed, index]), height, width)
    cv2.imwrite(path, image, [cv2.IMWRITE_JPEG_QUALITY, 88])


def make_set(out, count, height=375, width=500, workers=1, classes=1000):
    """``(lmdb path, mean JPEG bytes)``: ``count`` JPEGs of ``width`` x ``height`` in ``out``/jpeg (image i labelled
    i % ``classes``) and their Datum LMDB, made once (by ``workers`` forked processes)."""
    import multiprocessing

    db, folder = os.path.join(out, "lmdb"), os.path.join(out, "jpeg")
    if not os.path.isdir(db):
        os.makedirs(folder, exist_ok=True)
        jobs = [(os.path.join(folder, f"{i:05d}.jpg"), 0, i, height, width) for i in range(count)]
        if workers > 1:
            with multiprocessing.get_context("fork").Pool(workers, _one_opencv_thread) as pool:
                pool.map(write_image, jobs, chunksize=8)
        else:
            for job in jobs:
                write_image(job)
        with open(os.path.join(out, "list.txt"), "w") as f:
            f.write("".join(f"{i:05d}.jpg {i % classes}\n" for i in range(count)))
        subprocess.run([sys.executable, "-m", "layerforge", "convert_imageset", "--encoded", folder + "/",
                        os.path.join(out, "list.txt"), db], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    sizes = [os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)]
    return db, sum(sizes) / len(sizes)


def _one_opencv_thread():
    import cv2

    cv2.setNumThreads(1)  # the processes share the cores already


def jpeg_bytes(db, count=64):
    import lmdb

    from layerforge.caffe.caffe_pb import Datum

    with lmdb.open(db, readonly=True, lock=False) as env, env.begin() as txn:
        out = []
        for _, value in zip(range(count), txn.cursor()):
            datum = Datum()
            datum.ParseFromString(value[1])
            out.append(numpy.frombuffer(datum.data, numpy.uint8))
    return out


# --------------------------------------------------------------------------------------------------
# the decode limit, and threads against processes

def decode_cpu_ms(jpegs, seconds):
    """CPU milliseconds one cv2.imdecode takes on this thread (the limit's cost, whatever the load)."""
    import cv2

    count, start, cpu = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() - start < seconds:
        for b in jpegs:
            cv2.imdecode(b, cv2.IMREAD_COLOR)
        count += len(jpegs)
    return 1e3 * (time.thread_time() - cpu) / count


def decode_rate(jpegs, seconds, decode=None, workers=1, processes=False):
    """Images per second decoded by ``workers`` threads (or forked processes) calling ``decode``."""
    import multiprocessing

    import cv2

    decode = decode or (lambda b: cv2.imdecode(b, cv2.IMREAD_COLOR))

    def run(report):
        if processes:  # what a decode worker does
            from layerforge.data.images import catch_stderr_for_good
            catch_stderr_for_good()
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for b in jpegs:
                decode(b)
            count += len(jpegs)
        report(count / (time.perf_counter() - start))

    if processes:
        context = multiprocessing.get_context("fork")
        rates = context.SimpleQueue()
        runners = [context.Process(target=run, args=(rates.put,)) for _ in range(workers)]
    else:
        rates = []
        runners = [threading.Thread(target=run, args=(rates.append,)) for _ in range(workers)]
    for r in runners:
        r.start()
    for r in runners:
        r.join()
    return sum(rates.get() for _ in runners) if processes else sum(rates)


def primitives(jpegs, workers, seconds, repeats):
    """Rows ``(k, threads with the per-image capture, threads without, processes)``: best of ``repeats``."""
    from layerforge.data.images import decode_image

    caught = lambda b: decode_image(b, True, "bench")  # noqa: E731
    rows = []
    for k in workers:
        runs = [(decode_rate(jpegs, seconds, caught, k), decode_rate(jpegs, seconds, None, k),
                 decode_rate(jpegs, seconds, caught, k, processes=True)) for _ in range(repeats)]
        rows.append((k, *map(max, zip(*runs))))
    return rows


# --------------------------------------------------------------------------------------------------
# the two pipelines (each in a subprocess of its own)

def cpu_seconds(pids):
    """CPU seconds (user + system) this process and the processes ``pids`` have used so far (Linux /proc): what a
    pipeline costs, whatever share of the cores other work on the machine leaves it."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def run_layerforge(db, workers, batch, batches):
    """``{"rate": images/s of the Data layer's forwards, "step_ms", "wait": InputStats}``: the second figure runs
    the forwards again, each followed by a device step of 1.5 times a batch's decode time (a sleep: the CPU is
    free, as when a GPU computes) and keeps the layer's input statistics over those iterations."""
    from layerforge import rng
    from layerforge.blob import Blob
    from layerforge.layers import create_layer

    rng.seed(0)
    layer = create_layer({"name": "data", "type": "Data", "top": ["data", "label"],
                          "transform": {"crop_size": CROP, "mirror": True, "mean_value": list(MEAN)},
                          "data": {"source": db, "batch_size": batch, "decode_workers": workers}}, phase="TRAIN")
    top = [Blob(), Blob()]
    layer.setup([], top)
    for _ in range(WARMUP):
        layer.forward([], top)
    start, cpu = time.perf_counter(), cpu_seconds(layer.decode_pool.pids)
    for _ in range(batches):
        layer.forward([], top)
    rate = batches * batch / (time.perf_counter() - start)
    cpu_ms = 1e3 * (cpu_seconds(layer.decode_pool.pids) - cpu) / (batches * batch)
    step = 1.5 * batch / rate
    for _ in range(WARMUP):  # the workers fill the ring again
        layer.forward([], top)
        time.sleep(step)
    layer.input_stats.reset()
    for _ in range(batches):
        layer.forward([], top)
        time.sleep(step)
    layer.close()
    return {"rate": rate, "cpu_ms": cpu_ms, "step_ms": 1e3 * step, "wait": layer.input_stats.as_dict()}


def run_torch(db, workers, batch, batches):
    import random

    import cv2
    import lmdb
    import torch

    from layerforge.caffe.caffe_pb import Datum

    class Images(torch.utils.data.Dataset):
        """The LMDB's records as float32 (3, 224, 224) tensors: decode, random crop, mirror, mean."""

        def __init__(self):
            with lmdb.open(db, readonly=True, lock=False) as env, env.begin() as txn:
                self.keys = list(txn.cursor().iternext(keys=True, values=False))
            self.env, self.mean = None, numpy.array(MEAN, numpy.float32).reshape(3, 1, 1)

        def __len__(self):
            return len(self.keys)

        def __getitem__(self, i):
            if self.env is None:  # opened in the worker that reads
                self.env = lmdb.open(db, readonly=True, lock=False, readahead=False)
            with self.env.begin(buffers=True) as txn:
                datum = Datum()
                datum.ParseFromString(bytes(txn.get(self.keys[i])))
            image = cv2.imdecode(numpy.frombuffer(datum.data, numpy.uint8), cv2.IMREAD_COLOR)
            y0, x0 = random.randint(0, image.shape[0] - CROP), random.randint(0, image.shape[1] - CROP)
            window = image[y0:y0 + CROP, x0:x0 + CROP]
            if random.random() < 0.5:
                window = window[:, ::-1]
            return torch.from_numpy(window.transpose(2, 0, 1).astype(numpy.float32) - self.mean), datum.label

    def epochs(loader):  # as a training loop runs them: the workers stay, each epoch reshuffles
        while True:
            yield from loader

    data_loader = torch.utils.data.DataLoader(Images(), batch_size=batch, shuffle=True, num_workers=workers,
                                              drop_last=True, persistent_workers=True)
    loader = epochs(data_loader)
    for _ in range(WARMUP):
        next(loader)
    pids = [w.pid for w in data_loader._iterator._workers]  # the persistent workers (a private attribute)
    start, cpu = time.perf_counter(), cpu_seconds(pids)
    for _ in range(batches):
        next(loader)
    return {"rate": batches * batch / (time.perf_counter() - start),
            "cpu_ms": 1e3 * (cpu_seconds(pids) - cpu) / (batches * batch)}


def measure(framework, db, workers, batch, batches):
    out = subprocess.run([sys.executable, __file__, "--run", framework, "--db", db, "--workers", str(workers),
                          "--batch", str(batch), "--batches", str(batches)],
                         capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    if out.returncode != 0:
        sys.exit(f"{framework} with {workers} workers failed:\n{out.stderr}")
    return json.loads(out.stdout.splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", default=None, help="worker counts, e.g. 1,2 (default: 1 .. the cores)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=40, help="timed batches per pipeline")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each figure; the best is shown")
    parser.add_argument("--quick", action="store_true", help="48 images, batch 16, 3 batches, W = 1, 2, once (CI)")
    parser.add_argument("--out", default=None, help="where the set goes (default data/bench_data/<images>)")
    parser.add_argument("--run", choices=("layerforge", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run = run_layerforge if args.run == "layerforge" else run_torch
        print(json.dumps(run(args.db, int(args.workers), args.batch, args.batches)))
        return
    from layerforge.data.decode_pool import keep_images_on_the_heap

    keep_images_on_the_heap()  # the limit decodes as fast as this machine can: no page faults per image (docs/data.md)
    if args.quick:
        args.images, args.batch, args.batches, args.repeats, args.workers = 48, 16, 3, 1, args.workers or "1,2"
    workers = [int(w) for w in (args.workers or ",".join(map(str, range(1, os.cpu_count() + 1)))).split(",")]
    out = args.out or os.path.join(ROOT, "data", "bench_data", str(args.images))
    db, size = make_set(out, args.images, workers=os.cpu_count())
    jpegs = jpeg_bytes(db)
    seconds = 0.05 if args.quick else 2.0
    print(f"{args.images} JPEGs of 500x375, {size / 1024:.0f} KB on average; crop {CROP}, mirror, mean; batch "
          f"{args.batch}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f} at the start")
    print(f"{'workers':>7} | {'layerforge img/s':>16} | {'PyTorch img/s':>13} | {'limit img/s':>11} | "
          f"{'layerforge/limit':>16} | {'layerforge/PyTorch':>18} | {'CPU ms/img: layerforge':>22} | "
          f"{'PyTorch':>7} | {'imdecode':>8}")
    ours = {}
    for w in workers:  # best of --repeats, taken in turns: on a shared machine the others' load comes and goes
        runs = [(w * decode_rate(jpegs, seconds), measure("layerforge", db, w, args.batch, args.batches),
                 measure("torch", db, w, args.batch, args.batches), decode_cpu_ms(jpegs, seconds / 2))
                for _ in range(args.repeats)]
        limit = max(r[0] for r in runs)
        ours[w] = max((r[1] for r in runs), key=lambda r: r["rate"])
        theirs = max((r[2] for r in runs), key=lambda r: r["rate"])
        rate, cpu = ours[w]["rate"], [min(r[k]["cpu_ms"] for r in runs) for k in (1, 2)] + [min(r[3] for r in runs)]
        print(f"{w:>7} | {rate:>16,.0f} | {theirs['rate']:>13,.0f} | {limit:>11,.0f} | {rate / limit:>16.0%} | "
              f"{rate / theirs['rate']:>17.2f}x | {cpu[0]:>22.2f} | {cpu[1]:>7.2f} | {cpu[2]:>8.2f}")
    print("\ndata wait when the device computes each batch in 1.5x the time its decoding takes (the CPU free)")
    print(f"{'workers':>7} | {'decode ms/batch':>15} | {'device ms/batch':>15} | {'wait ms/batch':>13} | "
          f"{'wait, % of time':>15}")
    for w in workers:
        step, wait = ours[w]["step_ms"], ours[w]["wait"]
        print(f"{w:>7} | {step / 1.5:>15.1f} | {step:>15.1f} | {1e3 * wait['wait_s'] / wait['batches']:>13.2f} | "
              f"{wait['wait_share']:>15.1%}")
    print(f"\ndecode rates, img/s (threads vs processes; load average {os.getloadavg()[0]:.2f})")
    print(f"{'k':>3} | {'k threads, fd 2 caught per image':>32} | {'k threads, nothing caught':>25} | "
          f"{'k processes, fd 2 caught once':>29}")
    for k, locked, free, processes in primitives(jpegs, workers, seconds, args.repeats):
        print(f"{k:>3} | {locked:>32,.0f} | {free:>25,.0f} | {processes:>29,.0f}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
