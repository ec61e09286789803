"""The ``layerforge`` command: one subcommand per module in ``layerforge/commands/``.

Each command module has ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Errors caused by the user's input (LayerforgeError) print one line and exit 2, never a traceback.
"""
import argparse
import importlib
import sys

from .errors import LayerforgeError

# command name -> module under layerforge.commands
COMMANDS = {
    "bench-allreduce": "bench_allreduce",
    "check": "check",
    "compute_image_mean": "compute_image_mean",
    "convert_imageset": "convert_imageset",
    "layers": "layers",
    "summary": "summary",
    "test": "test",
    "time": "time",
    "train": "train",
}


def build_parser():
    parser = argparse.ArgumentParser(prog="layerforge", description="Caffe-style deep learning from YAML configs.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"layerforge.commands.{module_name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except LayerforgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
