"""``layerforge export NET.yaml --weights W -o net.onnx``: the net's inference graph as an ONNX model."""
from . import add_stage, stages
from ..net.netdef import load_net_def, set_batch_size

HELP = "export a net's inference graph (TEST phase, losses left out) with its weights as an ONNX model"


def add_arguments(parser):
    parser.add_argument("net", help="net YAML file (or a Caffe prototxt)")
    parser.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    parser.add_argument("--weights", help="weights (.npz) to export; default: the fillers' random values")
    parser.add_argument("--batch", type=int, help="the exported batch size (default: the net's own)")
    parser.add_argument("--phase", choices=("train", "test"), default="test", help="which phase's layers to export")
    add_stage(parser)
    parser.add_argument("--opset", type=int, default=17, help="ONNX operator set version")


def run(args):
    from ..export.onnx import export_onnx
    from ..net.net import Net

    netdef = load_net_def(args.net)
    if args.batch is not None:
        set_batch_size(netdef, args.batch)
    net = Net(netdef, phase=args.phase, stages=stages(args), weights=args.weights)
    model = export_onnx(net, args.output, opset=args.opset)
    graph = model.graph
    print(f"wrote {args.output}: {len(graph.node)} nodes, inputs {', '.join(v.name for v in graph.input)}, "
          f"outputs {', '.join(v.name for v in graph.output)}")
    return 0
