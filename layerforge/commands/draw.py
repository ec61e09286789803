"""``layerforge draw NET.yaml -o net.svg``: the net as a graph, like Caffe's draw_net.py.

Layers are boxes (name, type and the parameters the YAML sets); edges are blobs, labelled with their name
and shape from the built net; in-place layers (ReLU, BatchNorm...) appear in the chain of their blob.
Auto-inserted Split layers are not drawn: their consumers connect to the blob's producer. Output files
ending in ``.svg``/``.png``/``.pdf`` go through Graphviz's ``dot`` when it is installed and through
matplotlib otherwise; ``.dot`` (or no ``-o``) is DOT text. The drawing is layerforge/net/drawing.py's.
"""
import sys

from . import add_stage, stages
from ..net.drawing import render, to_dot
from ..net.net import Net
from ..net.netdef import load_net_def, set_batch_size

HELP = "draw a net as a graph (layers as boxes, blobs with shapes on edges): .svg/.png/.pdf, or DOT text"


def add_arguments(parser):
    parser.add_argument("net", help="net YAML file")
    parser.add_argument("-o", "--output", help="output file: .svg, .png, .pdf or .dot; "
                                               "default: DOT text on standard output")
    parser.add_argument("--engine", choices=("auto", "graphviz", "matplotlib"), default="auto",
                        help="renderer for .svg/.png/.pdf: auto = Graphviz's dot when installed, else matplotlib")
    parser.add_argument("--phase", choices=("train", "test"), default="train")
    add_stage(parser)
    parser.add_argument("--batch", type=int, help="override the batch size of input/data layers")
    parser.add_argument("--rankdir", choices=("TB", "LR", "BT", "RL"), default="TB", help="graph direction")


def run(args):
    netdef = load_net_def(args.net)
    if args.batch is not None:
        set_batch_size(netdef, args.batch)
    net = Net(netdef, phase=args.phase, stages=stages(args))
    if not args.output:
        sys.stdout.write(to_dot(net, args.rankdir))
        return 0
    print(f"wrote {render(net, args.output, args.rankdir, args.engine)}")
    return 0
