"""``layerforge make_example_data NAME...``: the databases of Caffe's examples, made offline (layerforge.data.examples)."""
from ..data.examples import EXAMPLES, MAKERS

HELP = ("write the data of Caffe's example nets (mnist, siamese, cifar10, hdf5_classification) at the paths they "
        "name, and the synthetic detection set (shapes) of configs/ssd_shapes_solver.yaml")


def add_arguments(parser):
    parser.add_argument("names", nargs="+", choices=tuple(MAKERS) + ("all",),
                        help="which examples' data to make (all: Caffe's examples, not shapes)")
    parser.add_argument("--root", default=".", help="the folder the examples run from (Caffe's root)")


def run(args):
    names = EXAMPLES if "all" in args.names else args.names
    for name in names:
        for path in MAKERS[name](args.root):
            print(f"{name}: {path}")
    return 0
