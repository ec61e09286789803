"""``layerforge get_image_size ROOT LISTFILE OUTFILE``: the SSD fork's tool that writes the ``name_size_file`` of
DetectionOutput's result files (and of its scoring scripts): one ``name height width`` line per listed image.

LISTFILE holds ``image annotation`` lines (convert_annoset's list); ``name`` is the image's file name without its
extension, or, with ``--name_id_file`` (lines of ``name id``), that name's id (ILSVRC's). The size is what OpenCV decodes (EXIF orientation applied).
"""
import os

from ..data.images import load_image, read_pair_list_file
from ..errors import DataError

HELP = "write 'name height width' of each listed image (the SSD fork's get_image_size, for name_size_file)"


def add_arguments(parser):
    parser.add_argument("root", help="folder the listed paths are relative to")
    parser.add_argument("listfile", help="list of 'image annotation' pairs (convert_annoset's)")
    parser.add_argument("outfile", help="the name size file to write")
    parser.add_argument("--name-id-file", "--name_id_file", dest="name_id_file", default="",
                        help="lines of 'name id': write each image's id instead of its name")


def run(args):
    images = read_pair_list_file(args.listfile, "image annotation")
    print(f"A total of {len(images)} images.")
    ids = None
    if args.name_id_file:
        ids = {}
        for name, value, _ in read_pair_list_file(args.name_id_file, "name id"):
            if name in ids:
                raise DataError(f"{args.name_id_file}: name '{name}' is given twice")
            try:
                ids[name] = int(value)
            except ValueError:
                raise DataError(f"{args.name_id_file}: the id of '{name}' is '{value}', not an integer") from None
        if len(ids) != len(images):
            raise DataError(f"{args.name_id_file}: {len(ids)} names for {len(images)} images in {args.listfile}")
    lines = []
    for count, (path, _, _) in enumerate(images, 1):
        image = load_image(os.path.join(args.root, path))
        if image is None:
            raise DataError(f"{args.listfile}: image {count} '{os.path.join(args.root, path)}' cannot be read")
        name = os.path.splitext(os.path.basename(path))[0]
        if ids is not None:
            if name not in ids:
                raise DataError(f"{args.name_id_file}: no id for image '{name}' ({args.listfile}, image {count})")
            name = ids[name]
        lines.append(f"{name} {image.shape[1]} {image.shape[2]}\n")
        if count % 1000 == 0:
            print(f"Processed {count} files.")
    if len(images) % 1000:
        print(f"Processed {len(images)} files.")
    try:
        with open(args.outfile, "w", encoding="utf-8") as f:
            f.writelines(lines)
    except OSError as e:
        raise DataError(f"{args.outfile}: cannot write the name size file: {e.strerror or e}") from None
    return 0
