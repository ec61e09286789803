"""``layerforge convert FILE.prototxt [-o FILE.yaml]``: a Caffe net or solver definition as layerforge YAML.

Whether the file is a net or a solver is read from its fields. A solver's ``net`` / ``train_net`` /
``test_net`` paths are rewritten to the YAML names of the converted nets (``--net``, or by default the
Caffe file's base name with ``.yaml``, expected next to the solver YAML). Notes (paths kept as written,
data-layer differences) go to stderr and into the YAML's header comments. docs/caffe-import.md.
"""
import os
import sys

from ..caffe.convert import convert_file, default_net_name, to_yaml
from ..errors import LayerforgeError

HELP = "convert a Caffe net or solver .prototxt to layerforge YAML (unsupported layers or fields are errors)"


def add_arguments(parser):
    parser.add_argument("prototxt", help="Caffe NetParameter or SolverParameter in protobuf text format")
    parser.add_argument("-o", "--output", metavar="YAML", help="write here (default: standard output)")
    parser.add_argument("--net", metavar="YAML",
                        help="solver only: the converted net's YAML path, written into 'net:' / 'train_net:' "
                             "relative to the output file (default: the Caffe net's base name + .yaml)")


def run(args):
    out_dir = os.path.dirname(os.path.abspath(args.output)) if args.output else os.getcwd()

    def rename_net(old, key):
        if args.net is None or key == "test_net":
            return default_net_name(old)
        return os.path.relpath(os.path.abspath(args.net), out_dir)

    kind, mapping, notes = convert_file(args.prototxt, rename_net)
    if kind == "net" and args.net is not None:
        raise LayerforgeError(f"{args.prototxt} is a net; --net applies to solver files")
    header = [f"Converted from {os.path.basename(args.prototxt)} by `layerforge convert` (docs/caffe-import.md)."]
    header += [f"note: {n}" for n in notes]
    text = to_yaml(mapping, header)
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    tmp = f"{args.output}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, args.output)
    what = f"net '{mapping.get('name', 'net')}', {len(mapping['layers'])} layers" if kind == "net" else "solver"
    print(f"wrote {args.output} ({what})")
    return 0
