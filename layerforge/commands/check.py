"""``layerforge check NET``: validate a net definition and build it in each phase.

Every layer's own definition is checked, and every problem found is listed, one line each; then each
phase is built (graph, shapes), which stops at the first problem there. Exit 2 when anything is wrong.
"""
import sys

from ..errors import ConfigError
from ..net.net import Net

HELP = ("validate a net (keys, types, graph, shapes): lists every layer's problems, one line each, then the "
        "first graph or shape problem; exit 2 if any")


def add_arguments(parser):
    parser.add_argument("net", help="net YAML (or prototxt) file")
    parser.add_argument("--phase", choices=("train", "test", "both"), default="both", help="phase(s) to build")


def layer_problems(path):
    """A ConfigError for every layer whose own definition is wrong (the graph is not built)."""
    from ..net.blocks import expand_blocks
    from ..layers.layer_param import parse_layer
    from ..net.netdef import item_line
    from ..solvers.caffe_solver import read_config_file

    mapping = expand_blocks(read_config_file(path), path)
    layers = mapping.get("layers", mapping.get("layer")) if isinstance(mapping, dict) else None
    problems = []
    for i, definition in enumerate(layers if isinstance(layers, list) else ()):
        try:
            parse_layer(definition, path, i, line=item_line(layers, i))
        except ConfigError as e:
            problems.append(e)
    return problems


def run(args):
    phases = ("train", "test") if args.phase == "both" else (args.phase,)
    try:
        built = [Net(args.net, phase=p) for p in phases]
    except ConfigError as first:
        try:
            problems = layer_problems(args.net)
        except ConfigError:
            problems = []
        lines = [str(e) for e in problems]
        if str(first) not in lines:
            lines.insert(0, str(first))
        for line in lines:
            print(f"error: {line}", file=sys.stderr)
        return 2
    if not any(n.layers for n in built):
        raise ConfigError(f"the net has no layers in the {' or '.join(p.upper() for p in phases)} phase", args.net)
    print(f"{args.net}: OK (" + ", ".join(f"{p}: {len(n.layers)} layers" for p, n in zip(phases, built)) + ")")
    return 0
