"""``layerforge convert_imageset ROOT LISTFILE DB``: images -> an LMDB database (Caffe's tool).

LISTFILE has one ``path label`` per line, paths relative to ROOT; with LISTFILE ``-`` ROOT is a folder
whose subfolders are the classes (labels 0, 1, ... in sorted name order, written to DB/labels.txt).
The database is built in a temporary directory and renamed into place.
"""
import os

import numpy

from ..data.images import folder_entries, load_image, read_list_file
from ..data.lmdb_io import encode_image_record, encode_record, write_lmdb_atomic
from ..errors import DataError

HELP = "convert images (a 'path label' list, or class subfolders) into an LMDB database for the Data layer"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".pgm", ".ppm", ".pbm", ".tif", ".tiff", ".webp")


def add_arguments(parser):
    parser.add_argument("root", help="folder the listed paths are relative to (or the class-folder root)")
    parser.add_argument("listfile", help="list file of 'path label' lines, or '-' for class subfolders of ROOT")
    parser.add_argument("db", help="the LMDB directory to create (must not exist)")
    parser.add_argument("--resize-height", type=int, default=0, metavar="H", help="resize to H rows (with -W)")
    parser.add_argument("--resize-width", type=int, default=0, metavar="W", help="resize to W columns (with -H)")
    parser.add_argument("--shuffle", action="store_true", help="write the images in a random order")
    parser.add_argument("--seed", type=int, default=0, help="seed of --shuffle's order (default 0)")
    parser.add_argument("--gray", action="store_true", help="store one grey channel instead of BGR")
    parser.add_argument("--encoded", action="store_true",
                        help="store encoded image files (the original bytes, or --encode-type after resizing)")
    parser.add_argument("--encode-type", choices=("png", "jpg"), default="png", help="format when re-encoding")


def _records(entries, root, source, args, shapes):
    import cv2
    resize = args.resize_height > 0 and args.resize_width > 0
    for path, label, line in entries:
        full = os.path.join(root, path)
        image = load_image(full, args.resize_height, args.resize_width, not args.gray)
        if image is None:
            where = f"{source}:{line}" if line else source
            raise DataError(f"{where}: image '{full}': cannot read the image (missing, or not an image)")
        shapes.add(image.shape)
        if not args.encoded:
            yield encode_record(image, label)
        elif not resize:
            yield encode_image_record(numpy.fromfile(full, dtype=numpy.uint8).tobytes(), image.shape, label)
        else:
            ok, data = cv2.imencode("." + args.encode_type, image[0] if args.gray else image.transpose(1, 2, 0))
            if not ok:
                raise DataError(f"{source}: image '{full}': cannot encode it as {args.encode_type}")
            yield encode_image_record(data.tobytes(), image.shape, label)


def run(args):
    if (args.resize_height > 0) != (args.resize_width > 0):
        raise DataError("give both --resize-height and --resize-width, or neither")
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
        print("note: the images differ in size; the Data layer needs one size (use --resize-height/--resize-width)")
    return 0
