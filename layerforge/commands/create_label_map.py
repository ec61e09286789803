"""``layerforge create_label_map MAPFILE OUTFILE``: the SSD fork's tool that writes a label map prototxt (the
``label_map_file`` of AnnotatedData, convert_annoset and DetectionOutput) from a list of class names.

Each line of MAPFILE is ``name``, ``name label`` or ``name label display_name``, the fields split at any
character of ``--delimiter``, every line with the same number of fields; one field numbers the classes in
order (from 1 after ``--include_background``'s ``none_of_the_above`` 0, display name ``background``), and the
display name is the name unless a third field gives it.
"""
import re

from ..data import read_text
from ..data.annotations import write_label_map
from ..errors import DataError

HELP = "write a label map prototxt from a list of class names (the SSD fork's create_label_map)"


def add_arguments(parser):
    parser.add_argument("mapfile", help="lines of 'name [label] [display_name]'")
    parser.add_argument("outfile", help="the label map prototxt to write")
    parser.add_argument("--include-background", "--include_background", dest="include_background",
                        action="store_true", help="class 0 is none_of_the_above (display name background)")
    parser.add_argument("--delimiter", default=" ", help="the characters that separate a line's fields")


def label_map_items(text, delimiter, include_background, path):
    """The ``(name, label, display_name)`` items of a MAPFILE's ``text``."""
    items = [("none_of_the_above", 0, "background")] if include_background else []
    label, width = len(items), None
    split = re.compile("[" + re.escape(delimiter) + "]") if delimiter else None
    for number, line in enumerate(text.splitlines(), 1):
        fields = split.split(line) if split else [line]
        if width is None:
            width = len(fields)
        if len(fields) != width:
            raise DataError(f"{path}:{number}: {len(fields)} fields, the first line has {width}")
        if not 1 <= width <= 3:
            raise DataError(f"{path}:{number}: {width} fields; a line is 'name [label] [display_name]'")
        if width > 1:
            try:
                label = int(fields[1])
            except ValueError:
                raise DataError(f"{path}:{number}: label '{fields[1]}' is not an integer") from None
        items.append((fields[0], label, fields[2] if width == 3 else fields[0]))
        label += 1
    return items


def run(args):
    items = label_map_items(read_text(args.mapfile, "class list"), args.delimiter, args.include_background,
                            args.mapfile)
    try:
        write_label_map(args.outfile, items)
    except OSError as e:
        raise DataError(f"{args.outfile}: cannot write the label map: {e.strerror or e}") from None
    print(f"{len(items)} classes written to {args.outfile}")
    return 0
