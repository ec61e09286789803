"""``layerforge convert_imageset ROOT LISTFILE DB``: images -> an LMDB database (Caffe's tool).

LISTFILE has one ``path label`` per line, paths relative to ROOT; with LISTFILE ``-`` ROOT is a folder
whose subfolders are the classes (labels 0, 1, ... in sorted name order, written to DB/labels.txt).
Records are Caffe's Datum messages (raw uint8 C x H x W, or with ``--encoded`` the image file's bytes,
re-encoded as ``--encode_type`` after resizing or when the type differs), so Caffe reads the database
too; ``--format lfr1`` writes layerforge's older record format instead. The database is built in a
temporary directory and renamed into place.
"""
import os

import numpy

from ..data.images import encoded_bytes, folder_entries, load_image, read_list_file
from ..data.datum import array_to_datum, encoded_datum
from ..data.lmdb_io import encode_image_record, encode_record, write_lmdb_atomic
from ..errors import DataError

HELP = "convert images (a 'path label' list, or class subfolders) into an LMDB database for the Data layer"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".pgm", ".ppm", ".pbm", ".tif", ".tiff", ".webp")


def add_arguments(parser):
    parser.add_argument("root", help="folder the listed paths are relative to (or the class-folder root)")
    parser.add_argument("listfile", help="list file of 'path label' lines, or '-' for class subfolders of ROOT")
    parser.add_argument("db", help="the LMDB directory to create (must not exist)")
    parser.add_argument("--resize-height", "--resize_height", dest="resize_height", type=int, default=0, metavar="H",
                        help="resize to H rows (with --resize_width)")
    parser.add_argument("--resize-width", "--resize_width", dest="resize_width", type=int, default=0, metavar="W",
                        help="resize to W columns (with --resize_height)")
    parser.add_argument("--shuffle", action="store_true", help="write the images in a random order")
    parser.add_argument("--seed", type=int, default=0, help="seed of --shuffle's order (default 0)")
    parser.add_argument("--gray", action="store_true", help="store one grey channel instead of BGR")
    parser.add_argument("--encoded", action="store_true",
                        help="store encoded image files (the original bytes, or --encode_type after resizing)")
    parser.add_argument("--encode-type", "--encode_type", dest="encode_type", choices=("png", "jpg"), default=None,
                        help="format of --encoded images that are (re-)encoded (default: the file's own type)")
    parser.add_argument("--format", choices=("datum", "lfr1"), default="datum",
                        help="record format: Caffe's Datum (default) or layerforge's LFR1")
    parser.add_argument("--check-size", "--check_size", dest="check_size", action="store_true",
                        help="stop at the first image whose size differs from the first one's (Caffe's flag)")
    parser.add_argument("--backend", choices=("lmdb",), default="lmdb", help="database kind (Caffe's; LMDB only)")


def _records(entries, root, source, args, shapes):
    datum = args.format == "datum"
    changed = bool(args.resize_height or args.gray)
    for path, label, line in entries:
        full = os.path.join(root, path)
        image = load_image(full, args.resize_height, args.resize_width, not args.gray)
        if image is None:
            where = f"{source}:{line}" if line else source
            raise DataError(f"{where}: image '{full}': cannot read the image (missing, or not an image)")
        if args.check_size and shapes and image.shape not in shapes:
            first = "x".join(map(str, next(iter(shapes))))
            raise DataError(f"image '{full}': size {'x'.join(map(str, image.shape))} differs from the first "
                            f"image's {first} (--check_size)")
        shapes.add(image.shape)
        if not args.encoded:
            yield array_to_datum(image, label).SerializeToString() if datum else encode_record(image, label)
        elif datum:
            yield encoded_datum(encoded_bytes(image, full, args.encode_type, changed), label).SerializeToString()
        else:
            yield encode_image_record(encoded_bytes(image, full, args.encode_type, changed), image.shape, label)


def run(args):
    if (args.resize_height > 0) != (args.resize_width > 0):
        raise DataError("give both --resize_height and --resize_width, or neither")
    classes = None
    if args.listfile == "-":
        entries, classes = folder_entries(args.root)
        entries = [e for e in entries if e[0].lower().endswith(IMAGE_EXTENSIONS)]
        source = args.root
    else:
        entries, source = read_list_file(args.listfile), args.listfile
    if args.shuffle:
        entries = [entries[i] for i in numpy.random.RandomState(args.seed).permutation(len(entries))]
    shapes = set()
    count = write_lmdb_atomic(args.db, _records(entries, args.root, source, args, shapes))
    if classes is not None:
        with open(os.path.join(args.db, "labels.txt"), "w") as f:
            f.writelines(f"{label} {name}\n" for label, name in enumerate(classes))
    sizes = ", ".join("x".join(map(str, s)) for s in sorted(shapes))
    print(f"wrote {count} images ({sizes}) to {args.db}")
    if len(shapes) > 1:
        print("note: the images differ in size; the Data layer needs one size (use --resize_height/--resize_width)")
    return 0
