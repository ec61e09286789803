"""``layerforge expand NET.yaml``: print the net with every block instance expanded into plain layers.

The output is a flat net definition (no ``blocks:``) that every other command reads as it is.
"""
import sys

import yaml

from ..net.blocks import expand_blocks
from ..net.netdef import load_net_def
from ..schema import load_yaml

HELP = "print a net with its reusable blocks expanded into plain layers (valid input for every command)"


def add_arguments(parser):
    parser.add_argument("net", help="net YAML file")
    parser.add_argument("-o", "--output", help="write to this file instead of standard output")


def plain(node):
    """LineDict/LineList -> dict/list, recursively (for yaml.safe_dump)."""
    if isinstance(node, dict):
        return {k: plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    return node


def _flow(value):
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf"), sort_keys=False).strip()


def to_yaml(mapping):
    """A net mapping as YAML text: one line per layer key, nested values in flow style."""
    lines = []
    for key, value in mapping.items():
        if key in ("layers", "layer") and isinstance(value, list):
            lines.append(f"{key}:")
            for layer in value:
                first = True
                for k, v in plain(layer).items():
                    lines.append(f"  {'- ' if first else '  '}{_flow({k: v})[1:-1]}")
                    first = False
        else:
            lines.append(_flow({key: plain(value)})[1:-1])
    return "\n".join(lines) + "\n"


def expand_file(path):
    """The expanded net of a YAML file as YAML text (checked: it must parse as a net definition)."""
    load_net_def(path)  # reports problems with file and line before anything is printed
    return to_yaml(expand_blocks(load_yaml(path), path))


def run(args):
    text = f"# expanded from {args.net} by layerforge expand\n" + expand_file(args.net)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0
