"""``layerforge draw NET.yaml -o net.svg``: the net as a graph, like Caffe's draw_net.py.

Layers are boxes (name, type and the parameters the YAML sets); edges are blobs, labelled with their name
and shape from the built net; in-place layers (ReLU, BatchNorm...) appear in the chain of their blob.
Auto-inserted Split layers are not drawn: their consumers connect to the blob's producer. Output files
ending in ``.svg``/``.png``/``.pdf`` go through Graphviz's ``dot`` when it is installed and through
matplotlib otherwise (layerforge/net/drawing.py); ``.dot`` (or no ``-o``) is DOT text.
"""
import os
import shutil
import subprocess
import sys

from ..errors import LayerforgeError
from ..net.net import Net
from ..net.netdef import load_net_def, set_batch_size
from ..schema import Params
from .summary import format_shape

HELP = "draw a net as a graph (layers as boxes, blobs with shapes on edges): .svg/.png/.pdf, or DOT text"

RENDERED = ("svg", "png", "pdf")
# fillers and file-level details add noise to a box; the rest of the given parameters are shown
_HIDDEN = {"weight_filler", "bias_filler", "filler", "data_filler", "engine", "prefetch", "decode_workers", "rank",
           "world_size"}
_COLOURS = {"Convolution": "#f4a582", "InnerProduct": "#92c5de", "Pooling": "#b8e186", "Data": "#fee08b",
            "ImageData": "#fee08b", "DummyData": "#fee08b", "SyntheticData": "#fee08b", "Input": "#fee08b",
            "Concat": "#d9d9d9", "Eltwise": "#d9d9d9", "BatchNorm": "#e0e0f8", "Scale": "#e0e0f8", "LRN": "#e0e0f8"}


def add_arguments(parser):
    parser.add_argument("net", help="net YAML file")
    parser.add_argument("-o", "--output", help="output file: .svg, .png, .pdf or .dot; "
                                               "default: DOT text on standard output")
    parser.add_argument("--engine", choices=("auto", "graphviz", "matplotlib"), default="auto",
                        help="renderer for .svg/.png/.pdf: auto = Graphviz's dot when installed, else matplotlib")
    parser.add_argument("--phase", choices=("train", "test"), default="train")
    parser.add_argument("--stage", action="append", default=[], help="a NetState stage (repeat for several)")
    parser.add_argument("--batch", type=int, help="override the batch size of input/data layers")
    parser.add_argument("--rankdir", choices=("TB", "LR", "BT", "RL"), default="TB", help="graph direction")


def _quote(text):
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _value(v):
    if isinstance(v, tuple) and all(isinstance(x, int) for x in v):
        return format_shape(v)  # a shape
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            return _value(v[0])
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def key_params(lp, per_line=3):
    """The scalar parameters a layer's YAML sets, as ``key: value`` lines (fillers left out)."""
    items = []
    for block, params in lp.__dict__.items():
        if not isinstance(params, Params) or block in _HIDDEN:
            continue
        for key, v in params.as_dict().items():
            if not params.given(key) or key in _HIDDEN or isinstance(v, Params) or v is None:
                continue
            if isinstance(v, (list, tuple)) and any(isinstance(x, Params) for x in v):
                continue
            items.append(f"{key}: {_value(v)}")
    return ["  ".join(items[k:k + per_line]) for k in range(0, len(items), per_line)]


def graph(net):
    """The drawn graph of a built Net: ``(nodes, edges)`` with nodes ``{id: (label lines, colour, shape)}``
    in the net's order and edges ``[(from id, to id, label)]``."""
    nodes, edges = {}, []
    producer = {}  # id(blob) -> node id of the layer whose value it currently holds
    alias = {}     # id(split output) -> the name of the blob it copies
    for i, layer in enumerate(net.layers):
        bottoms, tops = net.bottom_blobs(i), net.top_blobs(i)
        if layer.type == "Split":
            for t in tops:
                producer[id(t)] = producer.get(id(bottoms[0]))
                alias[id(t)] = alias.get(id(bottoms[0]), net.bottom_names(i)[0])
            continue
        node = f"l{i}"
        nodes[node] = ([layer.name, f"({layer.type})"] + key_params(layer.layer_param),
                       _COLOURS.get(layer.type, "#ffffff"), "box")
        for name, b in zip(net.bottom_names(i), bottoms):
            source = producer.get(id(b))
            if source is not None:
                edges.append((source, node, f"{alias.get(id(b), name)}\n{format_shape(tuple(b.shape))}"))
        for t in tops:
            producer[id(t)] = node
    for k, name in enumerate(net.outputs):
        b = net.blobs[name]
        if producer.get(id(b)) is not None:
            nodes[f"o{k}"] = ([name], "#eeeeee", "ellipse")
            edges.append((producer[id(b)], f"o{k}", format_shape(tuple(b.shape))))
    return nodes, edges


def definition_graph(netdef, phase="TRAIN", level=0, stages=()):
    """The drawn graph of a net definition that is not built (its data need not exist): layers as boxes
    (name, type, given parameters), blobs named on the edges, without shapes. Same form as :func:`graph`."""
    from ..layers.layer_param import layer_included

    nodes, edges, producer = {}, [], {}
    for i, lp in enumerate(l for l in netdef.layers if layer_included(l, phase.upper(), level, tuple(stages))):
        node = f"l{i}"
        nodes[node] = ([lp.name, f"({lp.type})"] + key_params(lp), _COLOURS.get(lp.type, "#ffffff"), "box")
        edges += [(producer[b], node, b) for b in lp.bottom if b in producer]
        producer.update((t, node) for t in lp.top)
    return nodes, edges


def to_dot(net, rankdir="TB", drawn=None):
    """DOT text for a built Net (or for a ``drawn`` (nodes, edges) graph of a net named ``net``)."""
    name = net if isinstance(net, str) else net.name
    lines = [f"digraph {_quote(name)} {{", f"  rankdir={rankdir};",
             '  node [shape=box, style="rounded,filled", fillcolor="#ffffff", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9];']
    nodes, edges = drawn or graph(net)
    for node, (label, colour, shape) in nodes.items():
        extra = ", shape=ellipse, style=filled" if shape == "ellipse" else ""
        lines.append(f"  {node} [label={_quote(chr(10).join(label))}{extra}, fillcolor={_quote(colour)}];")
    lines += [f"  {a} -> {b} [label={_quote(label)}];" for a, b, label in edges]
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(net, path, rankdir="TB", engine="auto", drawn=None):
    """Draw ``net`` to ``path``: DOT text for .dot; .svg/.png/.pdf through Graphviz's ``dot`` when it is
    installed (``engine`` "auto" or "graphviz"), else (or with ``engine="matplotlib"``) through matplotlib.
    ``drawn`` gives the (nodes, edges) graph to draw instead of the built ``net``'s (``net`` is then its name)."""
    drawn = drawn or graph(net)
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext in ("dot", "gv"):
        with open(path, "w", encoding="utf-8") as f:
            f.write(to_dot(net, rankdir, drawn))
        return path
    if ext not in RENDERED:
        raise LayerforgeError(f"{path}: unknown output format '.{ext}'; use .svg, .png, .pdf or .dot")
    dot = shutil.which("dot") if engine != "matplotlib" else None
    if dot is None:
        if engine == "graphviz":
            raise LayerforgeError(f"writing {path} with --engine graphviz needs Graphviz's 'dot' (not installed)")
        from ..net.drawing import render_matplotlib

        try:
            return render_matplotlib(*drawn, path, rankdir)
        except OSError as e:
            raise LayerforgeError(f"{path}: cannot write: {e.strerror}") from None
    proc = subprocess.run([dot, f"-T{ext}", "-o", path], input=to_dot(net, rankdir, drawn), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise LayerforgeError(f"dot failed on {path}: {proc.stderr.strip().splitlines()[-1] if proc.stderr else ''}")
    return path


def run(args):
    netdef = load_net_def(args.net)
    if args.batch is not None:
        set_batch_size(netdef, args.batch)
    net = Net(netdef, phase=args.phase, stages=args.stage)
    if not args.output:
        sys.stdout.write(to_dot(net, args.rankdir))
        return 0
    print(f"wrote {render(net, args.output, args.rankdir, args.engine)}")
    return 0
