"""``layerforge extract_features WEIGHTS NET BLOBS DATABASES BATCHES DB_TYPE [CPU|GPU] [DEVICE_ID]``: Caffe's
``extract_features`` tool, with its arguments in its order.

The net (its TEST phase, with WEIGHTS) runs forward BATCHES times; after each pass, every item of each named
blob goes into that blob's database as a Datum of float_data (channels, height and width as Caffe's
``Blob::channels() / height() / width()``: 1 past the blob's own axes) under the key ``%010d`` of its running
index, as Caffe writes them. Blob and database names are comma-separated lists of equal length. A database
that exists already is refused, as Caffe's ``db::NEW`` refuses it; ``leveldb`` is written as LMDB (layerforge
reads a LEVELDB source as LMDB at the same path).
"""
import logging
import os

from . import add_decode_workers, apply_decode_workers
from .. import backend
from ..data.datum import array_to_datum
from ..data.lmdb_io import LMDBWriter
from ..errors import LayerforgeError
from ..logs import setup_logging

HELP = "run a trained net forward and write the named blobs' items into LMDB databases of Datum (Caffe's tool)"
DB_TYPES = ("lmdb", "leveldb")
COMMIT_EVERY = 1000  # items per transaction, as Caffe's tool commits

log = logging.getLogger("layerforge")


def add_arguments(parser):
    add_decode_workers(parser)
    parser.add_argument("weights", help="weights: .npz (training or a snapshot), or Caffe's .caffemodel / .h5")
    parser.add_argument("net", help="the net (.prototxt or YAML); its TEST phase reads the data")
    parser.add_argument("blobs", help="blob names, comma-separated (e.g. fc7,prob)")
    parser.add_argument("databases", help="one output database per blob, comma-separated")
    parser.add_argument("batches", type=int, help="forward passes (mini-batches) to run")
    parser.add_argument("db_type", help="lmdb (leveldb is written as LMDB)")
    parser.add_argument("mode", nargs="?", default="CPU", choices=("CPU", "GPU"), help="CPU (default) or GPU")
    parser.add_argument("device_id", nargs="?", type=int, default=0, help="the GPU (default 0)")


def feature_datums(array):
    """The Datums of the items of a blob ``array`` (N, ...) as Caffe's tool writes them: float_data, with the
    blob's channels, height and width (1 past its own axes), no label."""
    legacy = tuple(array.shape[1:]) + (1,) * (4 - array.ndim)
    for item in array:
        yield array_to_datum(item.reshape(legacy), label=None)


def run(args):
    from ..net.net import Net

    apply_decode_workers(args)
    setup_logging()
    blobs, databases = args.blobs.split(","), args.databases.split(",")
    if len(blobs) != len(databases):
        raise LayerforgeError(f"{len(blobs)} blob names ({args.blobs}) and {len(databases)} database names "
                              f"({args.databases}): give one database per blob")
    if args.db_type.lower() not in DB_TYPES:
        raise LayerforgeError(f"db_type {args.db_type!r}: give lmdb (or leveldb, written as LMDB)")
    if args.batches < 1:
        raise LayerforgeError(f"batches {args.batches}: give at least 1 mini-batch")
    for path in databases:
        if os.path.exists(path):
            raise LayerforgeError(f"{path}: exists already; extract_features writes new databases only (as Caffe's)")
    xp = backend.gpu_array_module(args.device_id, "GPU") if args.mode == "GPU" else None
    net = Net(args.net, phase="test", weights=args.weights, **({"xp": xp} if xp is not None else {}))
    missing = [b for b in blobs if b not in net.blobs]
    if missing:
        raise LayerforgeError(f"{args.net}: the net has no blob {missing[0]!r} (its blobs: {', '.join(net.blobs)})")
    for name in blobs:
        if not 1 <= len(net.blobs[name].shape) <= 4:
            raise LayerforgeError(f"{args.net}: blob {name!r} has shape {net.blobs[name].shape}; a Datum holds the "
                                  "items of a blob of 1 to 4 axes")
    counts = [0] * len(blobs)
    writers = [LMDBWriter(path, commit_every=COMMIT_EVERY) for path in databases]
    try:
        for _ in range(args.batches):
            net.forward()
            for k, (name, writer) in enumerate(zip(blobs, writers)):
                for datum in feature_datums(backend.to_numpy(net.blobs[name].data)):
                    writer.put(datum.SerializeToString(), key=b"%010d" % counts[k])
                    counts[k] += 1
                    if counts[k] % COMMIT_EVERY == 0:
                        log.info("Extracted features of %d query images for feature blob %s", counts[k], name)
    finally:
        for writer in writers:
            writer.close()
    for name, count, path in zip(blobs, counts, databases):
        log.info("Extracted features of %d query images for feature blob %s into %s", count, name, path)
    return 0
