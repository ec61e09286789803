"""``layerforge convert_annoset ROOT LISTFILE DB``: images and their boxes -> an LMDB of AnnotatedDatum records.

The SSD fork's tool (``tools/convert_annoset.cpp``), library code in layerforge/data/annotations.py. LISTFILE has
``image annotation`` lines (``--anno_type detection``, the default here) or ``image label`` lines
(``classification``), paths relative to ROOT; annotations are VOC XML, the fork's JSON or TXT
(``--label_type``), names mapped to labels by ``--label_map_file``. Keys are ``%08d_<image path>``, as the fork
writes them; the database is built in a temporary directory and renamed into place.
"""
from ..data.annotations import LABEL_TYPES, convert_annoset
from ..errors import DataError

HELP = "convert images and box annotations (VOC XML, JSON, TXT) into an LMDB of AnnotatedDatum for AnnotatedData"


def add_arguments(parser):
    parser.add_argument("root", help="folder the listed paths are relative to")
    parser.add_argument("listfile", help="list file of 'image annotation' (or 'image label') lines")
    parser.add_argument("db", help="the LMDB directory to create (must not exist)")
    parser.add_argument("--anno_type", "--anno-type", dest="anno_type", choices=("detection", "classification"),
                        default="detection", help="boxes from annotation files (default), or a label per image")
    parser.add_argument("--label_type", "--label-type", dest="label_type", choices=LABEL_TYPES, default="xml",
                        help="format of the annotation files (default xml)")
    parser.add_argument("--label_map_file", "--label-map-file", dest="label_map_file", default=None,
                        help="LabelMap prototxt mapping names to labels (detection)")
    parser.add_argument("--check_label", "--check-label", dest="check_label", action="store_true",
                        help="refuse a label map with a repeated name or label")
    parser.add_argument("--min_dim", "--min-dim", dest="min_dim", type=int, default=0,
                        help="resize so the shorter side is at least this (aspect kept)")
    parser.add_argument("--max_dim", "--max-dim", dest="max_dim", type=int, default=0,
                        help="... and the longer side at most this")
    parser.add_argument("--resize_height", "--resize-height", dest="resize_height", type=int, default=0, metavar="H")
    parser.add_argument("--resize_width", "--resize-width", dest="resize_width", type=int, default=0, metavar="W")
    parser.add_argument("--gray", action="store_true", help="store one grey channel instead of BGR")
    parser.add_argument("--encoded", action="store_true", help="store encoded image files")
    parser.add_argument("--encode_type", "--encode-type", dest="encode_type", choices=("png", "jpg"), default=None,
                        help="format of re-encoded images (implies --encoded)")
    parser.add_argument("--shuffle", action="store_true", help="write the images in a random order")
    parser.add_argument("--seed", type=int, default=0, help="seed of --shuffle's order (default 0)")
    parser.add_argument("--check_size", "--check-size", dest="check_size", action="store_true",
                        help="stop when an image's size differs from the first one's")
    parser.add_argument("--backend", choices=("lmdb",), default="lmdb", help="database kind (LMDB only)")


def run(args):
    if (args.resize_height > 0) != (args.resize_width > 0):
        raise DataError("give both --resize_height and --resize_width, or neither")
    stats = convert_annoset(args.root, args.listfile, args.db, args.anno_type, args.label_type, args.label_map_file,
                            args.check_label, args.shuffle, args.seed, gray=args.gray, encoded=args.encoded,
                            encode_type=args.encode_type, height=args.resize_height, width=args.resize_width,
                            min_dim=args.min_dim, max_dim=args.max_dim, check_size=args.check_size)
    shapes = sorted(stats["shapes"])
    sizes = ", ".join("x".join(map(str, s)) for s in shapes) if len(shapes) <= 3 else \
        f"{len(shapes)} sizes from {'x'.join(map(str, shapes[0]))} to {'x'.join(map(str, shapes[-1]))}"
    boxes = f", {stats['boxes']} boxes" if args.anno_type == "detection" else ""
    print(f"wrote {stats['images']} images ({sizes}){boxes} to {args.db}")
    if stats["unannotated"]:
        print(f"note: {stats['unannotated']} images have no annotation file (stored without boxes)")
    return 0
