"""``layerforge compute_image_mean DB OUT``: the mean image of an LMDB database (Caffe's tool).

OUT ending in ``.npz`` holds the array under the name ``mean``; otherwise a ``.npy`` is written. Either
can be given to a Data layer as ``transform: {mean_file: OUT}``.
"""
import os

import numpy

from ..data.lmdb_io import LMDBReader
from ..errors import DataError

HELP = "compute the mean image (C, H, W) of an LMDB database and save it as .npy or .npz (transform.mean_file)"


def add_arguments(parser):
    parser.add_argument("db", help="the LMDB directory")
    parser.add_argument("out", help="output file, .npy or .npz")


def run(args):
    reader = LMDBReader(args.db)
    total = None
    for start in range(0, len(reader), 256):
        indices = range(start, min(start + 256, len(reader)))
        for i, (array, _) in zip(indices, reader.read_many(indices)):
            if total is None:
                total = numpy.zeros(array.shape, numpy.float64)
            elif array.shape != total.shape:
                raise DataError(f"{reader.name_of(i)}: shape {array.shape} differs from the first record's "
                                f"{total.shape}; a mean needs one size")
            total += array
    mean = (total / len(reader)).astype(numpy.float32)
    out = args.out if args.out.endswith((".npy", ".npz")) else args.out + ".npy"
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        if out.endswith(".npz"):
            numpy.savez(f, mean=mean)
        else:
            numpy.save(f, mean)
    os.replace(tmp, out)
    channels = ", ".join(f"{m:.4f}" for m in mean.mean(axis=(1, 2)))
    print(f"mean of {len(reader)} records, shape {mean.shape}, per channel [{channels}], written to {out}")
    return 0
