"""``layerforge check NET.yaml``: validate a net definition and build it in each phase, printing one line."""
from ..errors import ConfigError
from ..net import Net

HELP = "validate a net definition (keys, types, graph, shapes) and exit 2 with one line on the first problem"


def add_arguments(parser):
    parser.add_argument("net", help="net YAML file")
    parser.add_argument("--phase", choices=("train", "test", "both"), default="both", help="phase(s) to build")


def run(args):
    phases = ("train", "test") if args.phase == "both" else (args.phase,)
    built = [Net(args.net, phase=p) for p in phases]
    if not any(n.layers for n in built):
        raise ConfigError(f"the net has no layers in the {' or '.join(p.upper() for p in phases)} phase", args.net)
    print(f"{args.net}: OK (" + ", ".join(f"{p}: {len(n.layers)} layers" for p, n in zip(phases, built)) + ")")
    return 0
