"""OpenPose's training input: the CPMData layer on its decode workers, beside PyTorch's DataLoader running the same
transform, and beside one core's rate.

    python benchmarks/bench_pose_data.py [--records 96] [--workers 1,2] [--batches 10] [--repeats 2] [--quick]

Makes, once, under data/bench_pose/ (gitignored) an LMDB of ``--records`` records as the fork's genLMDB.py writes
COCO's: 6 x 480 x 640 uint8 Datums (a picture of smooth colour fields with texture and noise; the metadata of a
person and 0 to 3 others, 17 joints each; mask_miss with an unannotated region; mask_all). Then, for each worker
count W, side by side, each in its own process:

* layerforge: a CPMData layer (TRAIN) with the fork's COCO parameters (setLayers.py's: stride 8, crop 368 x 368,
  rotation up to 40 degrees, scale 0.5 to 1.1, target_dist 0.6, centre moved up to 40 pixels, num_parts 56),
  batch 10, ``decode_workers`` W, its forward filling float32 tops (data 10 x 6 x 368 x 368, label 10 x 114 x 46
  x 46);
* PyTorch: ``DataLoader(num_workers=W, batch_size=10, shuffle=True, persistent_workers=True)`` over a Dataset that
  reads the same records (LMDB, Datum) and calls the same transform (layerforge.data.pose.PoseTransform) into
  float32 tensors of the same shapes;
* the limit: W times one core's rate of reading and transforming a record in one process (no batching).

Every pipeline's transform runs with one OpenCV thread per process, as layerforge's decode workers do (OpenCV's
own pool would otherwise spread one PyTorch worker, or the limit, over every core).

Images per second over ``--batches`` batches after 3 warm-up batches; each figure the best of ``--repeats``
measurements taken in turns. ``--quick`` (CI): 12 small records, crop 96, 2 batches, W = 1, 2, once; one timed SGEMM.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BATCH = 10


def params(crop):
    return {"stride": 8, "crop_size_x": crop, "crop_size_y": crop, "max_rotate_degree": 40, "scale_prob": 1,
            "scale_min": 0.5, "scale_max": 1.1, "target_dist": 0.6, "center_perterb_max": 40, "num_parts": 56,
            "np_in_lmdb": 17}


def person(r, height, width):
    """17 joints (1-based x, y, visibility as COCO's JSON gives them: 0 occluded, 1 visible, 2 unlabelled)."""
    centre = r.uniform([width * 0.2, height * 0.2], [width * 0.8, height * 0.8])
    size = r.uniform(0.15, 0.4) * height
    xy = centre + r.normal(0, size / 3, (17, 2))
    return centre, size / height, numpy.concatenate([xy + 1, r.choice([0, 1, 1, 1, 2], (17, 1))], 1)


def make_record(seed, height, width):
    import cv2

    from layerforge.data.pose import encode_meta

    r = numpy.random.default_rng(seed)
    small = r.integers(0, 256, (height // 32 + 1, width // 32 + 1, 3)).astype(numpy.uint8)
    picture = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
    picture = numpy.clip(picture + r.normal(0, 12, picture.shape), 0, 255).astype(numpy.uint8)
    centre, scale, joints = person(r, height, width)
    others = [(c + 1, s, j) for c, s, j in (person(r, height, width) for _ in range(int(r.integers(0, 4))))]
    meta = encode_meta((height, width), "COCO", centre + 1, scale, joints, others, write_number=seed)
    mask = numpy.full((height, width), 255, numpy.uint8)
    y, x = int(r.integers(0, height // 2)), int(r.integers(0, width // 2))
    mask[y:y + height // 4, x:x + width // 4] = 0
    return numpy.concatenate([picture.transpose(2, 0, 1), meta[None], mask[None], (255 - mask)[None]])


def make_set(out, count, height, width):
    from layerforge.data.datum import array_to_datum
    from layerforge.data.lmdb_io import LMDBWriter, lmdb_exists

    db = os.path.join(out, f"pose_{count}_{height}x{width}_lmdb")
    if not lmdb_exists(db):
        os.makedirs(out, exist_ok=True)
        with LMDBWriter(db, map_size=(count * 6 * height * width) * 2 + (64 << 20)) as w:
            for k in range(count):
                w.put(array_to_datum(make_record(k, height, width)).SerializeToString())
    return db


def run_layerforge(db, workers, batches, crop):
    from layerforge.blob import Blob
    from layerforge.layers import create_layer

    layer = create_layer({"name": "data", "type": "CPMData", "top": ["data", "label"],
                          "data": {"source": db, "batch_size": BATCH, "decode_workers": workers},
                          "cpm_transform": params(crop)}, phase="TRAIN")
    top = [Blob(), Blob()]
    layer.setup([], top)
    for _ in range(3):
        layer.forward([], top)
    t0 = time.perf_counter()
    for _ in range(batches):
        layer.forward([], top)
    seconds = time.perf_counter() - t0
    layer.close()
    return {"img_s": batches * BATCH / seconds, "shapes": [list(top[0].shape), list(top[1].shape)]}


class PoseDataset:
    """The same records and transform, for PyTorch's DataLoader (the LMDB opened in each worker)."""

    def __init__(self, db, crop):
        from layerforge.data.lmdb_io import LMDBReader
        from layerforge.data.pose import PoseTransform
        from layerforge.layers.cpm_data import CPM_TRANSFORM
        from layerforge.schema import Context, validate_block

        self.db, self.reader = db, None
        self.size = len(LMDBReader(db))
        self.transform = PoseTransform(validate_block(params(crop), CPM_TRANSFORM, Context()), "TRAIN")
        self.count = 0

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        import torch

        from layerforge.data.lmdb_io import LMDBReader

        if self.reader is None:
            self.reader = LMDBReader(self.db)
        record, _ = self.reader.read(index)
        self.count += 1
        image, label, _, _ = self.transform(record, str(index), numpy.random.default_rng([os.getpid(), self.count]))
        data = numpy.zeros((record.shape[0],) + image.shape[1:], numpy.float32)
        data[:3] = (image.astype(numpy.float32) - 128) / 256
        return torch.from_numpy(data), torch.from_numpy(label)


def one_opencv_thread():
    """One OpenCV thread, as each of layerforge's decode workers has: set before PyTorch's workers fork (a forked
    child may not change the count of a pool its parent started)."""
    import cv2

    cv2.setNumThreads(1)


def run_torch(db, workers, batches, crop):
    import torch

    torch.set_num_threads(1)
    one_opencv_thread()
    loader = torch.utils.data.DataLoader(PoseDataset(db, crop), batch_size=BATCH, shuffle=True, num_workers=workers,
                                         persistent_workers=True, drop_last=True)

    def forever():
        while True:
            yield from loader

    batches_iter = forever()
    for _ in range(3):
        data, label = next(batches_iter)
    t0 = time.perf_counter()
    for _ in range(batches):
        data, label = next(batches_iter)
    seconds = time.perf_counter() - t0
    return {"img_s": batches * BATCH / seconds, "shapes": [list(data.shape), list(label.shape)]}


def run_limit(db, workers, batches, crop):
    """One core: read and transform records one after another, times W."""
    from layerforge.data.lmdb_io import LMDBReader

    one_opencv_thread()
    dataset = PoseDataset(db, crop)

    reader = LMDBReader(db)
    count = max(BATCH, batches * BATCH // 2)
    for k in range(3):
        dataset.transform(reader.read(k % len(reader))[0], "warm-up", numpy.random.default_rng(k))
    t0 = time.perf_counter()
    for k in range(count):
        dataset.transform(reader.read(k % len(reader))[0], str(k), numpy.random.default_rng(k))
    return {"img_s": workers * count / (time.perf_counter() - t0)}


RUNNERS = {"layerforge": run_layerforge, "torch": run_torch, "limit": run_limit}


def measure(kind, db, workers, batches, crop):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, "--db", db, "--workers",
                          str(workers), "--batches", str(batches), "--crop", str(crop)], capture_output=True,
                         text=True, env=env)
    if out.returncode:
        raise SystemExit(f"{kind} with {workers} workers failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=96)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--crop", type=int, default=368)
    parser.add_argument("--quick", action="store_true", help="CI: 12 small records, crop 96, 2 batches, once")
    parser.add_argument("--out", default=os.path.join(ROOT, "data", "bench_pose"))
    parser.add_argument("--child", choices=sorted(RUNNERS))
    parser.add_argument("--db")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(RUNNERS[args.child](args.db, int(args.workers), args.batches, args.crop)))
        return
    size = (480, 640)
    if args.quick:
        args.records, args.batches, args.repeats, args.crop, size = 12, 2, 1, 96, (120, 160)
    import bench_train

    print("\n".join(bench_train.machine_report(1, 1 if args.quick else 5)[1]))  # --quick: one timed SGEMM
    db = make_set(args.out, args.records, *size)
    print(f"{args.records} records of 6 x {size[0]} x {size[1]} (genLMDB.py's COCO layout), batch {BATCH}, crop "
          f"{args.crop}, stride 8; images/s, best of {args.repeats}; load average before: "
          f"{os.getloadavg()[0]:.2f}")
    print("| workers | layerforge CPMData | PyTorch DataLoader, same transform | W x one core | lf / torch |")
    print("|---|---|---|---|---|")
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        best = {kind: 0.0 for kind in ("limit", "layerforge", "torch")}
        for _ in range(args.repeats):
            for kind in best:
                best[kind] = max(best[kind], measure(kind, db, workers, args.batches, args.crop)["img_s"])
        rows.append(dict(best, workers=workers))
        print(f"| {workers} | {best['layerforge']:.1f} | {best['torch']:.1f} | {best['limit']:.1f} | "
              f"{best['layerforge'] / best['torch']:.2f} |", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
