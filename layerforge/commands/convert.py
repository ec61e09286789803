"""``layerforge convert FILE.prototxt [-o FILE.yaml]``: a Caffe net or solver definition as layerforge YAML;
``layerforge convert W.caffemodel -o W.npz`` / ``W.npz --model NET -o W.caffemodel``: weights either way;
``--fork textboxes``: a net of a fork that computes otherwise under the same fields (MhLiao/TextBoxes' PriorBox).

Whether the file is a net or a solver is read from its fields. A solver's ``net`` / ``train_net`` /
``test_net`` paths are rewritten to the YAML names of the converted nets (``--net``, or by default the
Caffe file's base name with ``.yaml``, expected next to the solver YAML). Notes (paths kept as written,
data-layer differences) go to stderr and into the YAML's header comments. docs/caffe-import.md.

Weights: a ``.caffemodel`` (or Caffe's ``.caffemodel.h5``) becomes an ``.npz`` of ``<layer>/<index>``
arrays, the blobs' shapes as stored, or with ``--model`` as copied into that net (Caffe's rules: legacy
4-d shapes take the net's). An ``.npz`` needs ``--model`` (its layers' types, bottoms and tops) to become
a ``.caffemodel`` or ``.caffemodel.h5``. docs/caffe-formats.md.
"""
import os
import sys

from ..caffe.caffemodel import caffemodel_arrays, hdf5_arrays, is_caffe_weights, save_caffemodel, save_hdf5
from ..errors import LayerforgeError
from ..net.net import Net
from ..npz import save_npz_atomic
from ..solvers.caffe_import import convert_file
from ..solvers.caffe_solver import default_net_name
from ..yaml_text import to_yaml

HELP = ("convert a Caffe net or solver .prototxt to layerforge YAML (unsupported layers or fields are errors), "
        "or weights between .caffemodel and .npz")
WEIGHTS_OUTPUTS = (".npz", ".caffemodel", ".h5", ".hdf5")


def add_arguments(parser):
    parser.add_argument("prototxt", metavar="FILE",
                        help="Caffe NetParameter or SolverParameter in protobuf text format, or weights "
                             "(.caffemodel, .caffemodel.h5, .npz)")
    parser.add_argument("-o", "--output", metavar="OUT",
                        help="write here (a prototxt's YAML: default standard output; weights: .npz, .caffemodel "
                             "or .caffemodel.h5)")
    parser.add_argument("--model", metavar="NET", help="weights only: the net (YAML or prototxt) they belong to")
    parser.add_argument("--phase", choices=("train", "test"), default="train", help="weights only: the net's phase")
    parser.add_argument("--fork", choices=sorted(FORK_SEMANTICS),
                        help="net only: the Caffe fork the file was written for, where it gives a layer type of "
                             "the ssd branch other semantics under the same fields (textboxes: MhLiao/TextBoxes, "
                             "whose PriorBox repeats every prior half a cell lower)")
    parser.add_argument("--net", metavar="YAML",
                        help="solver only: the converted net's YAML path, written into 'net:' / 'train_net:' "
                             "relative to the output file (default: the Caffe net's base name + .yaml)")


def textboxes_priors(path, mapping):
    """MhLiao/TextBoxes' PriorBox (its src/caffe/layers/prior_box_layer.cpp) emits every prior twice, at the cell's
    centre and half a cell lower, with the ssd branch's fields: in layerforge's (OpenCV's) terms, two offset
    pairs."""
    priors = [layer for layer in mapping["layers"] if layer.get("type") == "PriorBox"]
    if not priors:
        raise LayerforgeError(f"{path}: --fork textboxes: the net has no PriorBox layer (the only type TextBoxes "
                              f"changes)")
    for layer in priors:
        p = layer.setdefault("prior_box", {})
        given = [k for k in ("offset", "offset_w", "offset_h", "step", "step_h", "step_w") if k in p]
        if given:
            raise LayerforgeError(f"{path}: layer '{layer['name']}' (PriorBox): key 'prior_box.{given[0]}': "
                                  f"--fork textboxes places the priors itself (TextBoxes' PriorBox has no such field)")
        p["offset_w"], p["offset_h"] = [0.5, 0.5], [0.5, 1.0]
    return [f"--fork textboxes: {len(priors)} PriorBox layers repeat every prior half a cell lower, as TextBoxes' "
            f"fork does (offset_w: [0.5, 0.5], offset_h: [0.5, 1.0])"]


# fork -> rewrite(path, mapping) -> notes: a fork whose layers compute otherwise under the ssd branch's fields
FORK_SEMANTICS = {"textboxes": textboxes_priors}


def convert_weights(args):
    source, out = args.prototxt, args.output
    if out is None or not out.endswith(WEIGHTS_OUTPUTS):
        raise LayerforgeError(f"{source}: converting weights needs -o OUT ending in .npz, .caffemodel or .h5")
    net = None
    if args.model is not None:
        net = Net(args.model, phase=args.phase)
        if is_caffe_weights(source):
            net.copy_from(source)
        else:
            net.load(source)  # every parameter of the net must be in the .npz
    if out.endswith(".npz") and (net is not None or is_caffe_weights(source)):
        arrays = net.state_arrays() if net is not None else \
            hdf5_arrays(source) if source.endswith((".h5", ".hdf5")) else caffemodel_arrays(source)
        save_npz_atomic(out, arrays)
        print(f"wrote {out} ({len(arrays)} arrays)")
        return 0
    if net is None:
        raise LayerforgeError(f"{source}: writing {out} needs --model NET (its layers' types and tops)")
    (save_hdf5 if out.endswith((".h5", ".hdf5")) else save_caffemodel)(net, out)
    print(f"wrote {out} (net '{net.name}', {len(net.params)} layers with weights)")
    return 0


def run(args):
    if args.prototxt.endswith((".caffemodel", ".h5", ".hdf5", ".npz")):
        return convert_weights(args)
    if args.model is not None:
        raise LayerforgeError(f"{args.prototxt}: --model applies to weights files (.caffemodel, .npz)")
    out_dir = os.path.dirname(os.path.abspath(args.output)) if args.output else os.getcwd()

    def rename_net(old, key):
        if args.net is None or key == "test_net":
            return default_net_name(old)
        return os.path.relpath(os.path.abspath(args.net), out_dir)

    kind, mapping, notes = convert_file(args.prototxt, rename_net)
    if kind == "net" and args.net is not None:
        raise LayerforgeError(f"{args.prototxt} is a net; --net applies to solver files")
    if args.fork is not None:
        if kind != "net":
            raise LayerforgeError(f"{args.prototxt} is a solver; --fork applies to net files")
        notes = notes + FORK_SEMANTICS[args.fork](args.prototxt, mapping)
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
