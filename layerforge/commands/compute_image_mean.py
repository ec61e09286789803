"""``layerforge compute_image_mean DB OUT``: the mean image of an LMDB database (Caffe's tool).

OUT ending in ``.npz`` holds the array under the name ``mean``; ending in ``.binaryproto`` it is Caffe's
mean file (a BlobProto of shape 1 x C x H x W); otherwise a ``.npy`` is written. Any of them can be given
to a Data layer as ``transform: {mean_file: OUT}``.
"""
import numpy

from ..caffe.blobproto import write_blobproto
from ..data.lmdb_io import LMDBReader
from ..errors import DataError
from ..npz import write_atomic

HELP = "compute the mean image (C, H, W) of an LMDB database as .npy, .npz or Caffe .binaryproto (transform.mean_file)"


def add_arguments(parser):
    parser.add_argument("db", help="the LMDB directory")
    parser.add_argument("out", help="output file, .npy, .npz or .binaryproto")


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
    out = args.out if args.out.endswith((".npy", ".npz", ".binaryproto")) else args.out + ".npy"
    if out.endswith(".binaryproto"):
        write_blobproto(out, mean[None])
    else:
        write_atomic(out, lambda f: numpy.savez(f, mean=mean) if out.endswith(".npz") else numpy.save(f, mean))
    channels = ", ".join(f"{m:.4f}" for m in mean.mean(axis=(1, 2)))
    print(f"mean of {len(reader)} records, shape {mean.shape}, per channel [{channels}], written to {out}")
    return 0
