"""The ``layerforge`` command: one subcommand per module in ``layerforge/commands/``.

Each command module has ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Errors caused by the user's input (LayerforgeError) print one line and exit 2, never a traceback. Ctrl-C or SIGTERM
outside training's loop (which takes them as requests: solvers/signals.py) ends a command at once with one line,
``interrupted by SIGINT``, and the exit status a shell gives a process the signal ended (130, 143).
"""
import argparse
import importlib
import os
import signal
import sys

from .errors import LayerforgeError, exit_within, interrupting, out_of_memory

# command name -> module under layerforge.commands; names are Caffe's tools' style, words joined by "_"
COMMANDS = {
    "bench_allreduce": "bench_allreduce",
    "check": "check",
    "compute_image_mean": "compute_image_mean",
    "convert": "convert",
    "convert_annoset": "convert_annoset",
    "convert_imageset": "convert_imageset",
    "create_label_map": "create_label_map",
    "device_query": "device_query",
    "draw": "draw",
    "expand": "expand",
    "extract_features": "extract_features",
    "export": "export",
    "get_image_size": "get_image_size",
    "layers": "layers",
    "make_example_data": "make_example_data",
    "plan": "plan",
    "summary": "summary",
    "test": "test",
    "testbed": "testbed",
    "time": "time",
    "trace": "trace",
    "train": "train",
}


# an old spelling -> the command's name (both keep working; the docs use the name)
ALIASES = {"bench-allreduce": "bench_allreduce"}


def command_name(word):
    """The command ``word`` names (itself, or the command of an old spelling in ALIASES)."""
    return ALIASES.get(word, word)


class _DefaultsHelp(argparse.HelpFormatter):
    """Shows each option's default in its help, where it has a meaningful one (not None, False or already said)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or "default" in text.lower() or default in (None, False, argparse.SUPPRESS)
                or action.option_strings == [] and action.nargs in ("?", "*")):
            return text
        return text + " (default: %(default)s)"


def _version():
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("layerforge")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser(only=None):
    """The argument parser; with ``only`` (a command's name or old spelling), just that command's module is
    imported."""
    only = command_name(only) if only is not None else None
    parser = argparse.ArgumentParser(prog="layerforge", description="Caffe-style deep learning from YAML configs.",
                                     formatter_class=_DefaultsHelp)
    parser.add_argument("--version", action="version", version=f"layerforge {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"layerforge.commands.{module_name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP, formatter_class=_DefaultsHelp,
                           aliases=[old for old, new in ALIASES.items() if new == name])
        module.add_arguments(p)
        p.add_argument("-v", "--verbose", action="store_true",
                       help="show the log's lines of detail (each convolution's engine choice; GLOG_v=1 does too)")
        p.set_defaults(run=module.run)
    return parser


# Caffe's tool (``caffe train -solver s.prototxt -gpu 0``): its commands, and its gflags spelled as layerforge's
CAFFE_COMMANDS = ("train", "test", "time", "device_query")
CAFFE_VALUES = {"phase": str.lower}  # -phase TRAIN / TEST


def from_caffe_argv(argv):
    """Caffe's ``caffe`` command line as layerforge's: the command, then its gflags (:func:`gflags_argv`) as the
    command's options (``-sigint_effect`` is ``--sigint-effect``, ``-phase TRAIN`` is ``--phase train``). A
    LayerforgeError names a command Caffe's tool has but this one does not take."""
    if not argv or argv[0] not in CAFFE_COMMANDS:
        raise LayerforgeError(f"caffe {argv[0] if argv else ''}: commands are {', '.join(CAFFE_COMMANDS)} "
                              "(usage: caffe <command> -flag value ...)")
    commands = next(a for a in build_parser(argv[0])._actions if isinstance(a, argparse._SubParsersAction))
    return [argv[0]] + gflags_argv(commands.choices[argv[0]], argv[1:], CAFFE_VALUES)


def caffe_main(argv=None):
    """``tools/caffe``: Caffe's tool command line run by layerforge (train, test, time, device_query)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        argv = from_caffe_argv(argv)
    except LayerforgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return main(argv)


GFLAGS_TRUE, GFLAGS_FALSE = ("true", "t", "yes", "y", "1"), ("false", "f", "no", "n", "0")


def gflags_argv(parser, argv, values=None):
    """The gflags command line of one of Caffe's tools (``-flag``, ``--flag=value``, ``--flag value``,
    ``--bool=True`` / ``--bool=false``, ``--nobool``) as ``parser`` (argparse; its option ``--flag`` or
    ``--fl-ag`` for gflags' ``fl_ag``) takes it: a boolean flag set true is ``--flag``, set false is left out, as
    is a flag set to the empty string (gflags' default of a string flag); ``values`` maps a flag's name to a
    function of its value. A LayerforgeError names a boolean flag given something other than true or false."""
    def option(name):
        for spelling in (name, name.replace("_", "-")):
            action = parser._option_string_actions.get("--" + spelling)
            if action is not None:
                return "--" + spelling, isinstance(action, argparse._StoreTrueAction)
        return None, False

    values = values or {}
    out, pending = [], None
    for arg in argv:
        if not arg.startswith("-") or len(arg) == 1 or arg.lstrip("-")[:1].isdigit():
            out.append(pending(arg) if pending else arg)
            pending = None
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        flag, boolean = option(name)
        pending = None
        if flag is None and name.startswith("no") and option(name[2:])[1]:
            continue  # --noflag: a boolean set false
        if flag is None:
            out.append(arg)  # argparse names it
        elif boolean and eq:
            if value.lower() not in GFLAGS_TRUE + GFLAGS_FALSE:
                raise LayerforgeError(f"{parser.prog}: flag --{name} is true or false, not '{value}'")
            if value.lower() in GFLAGS_TRUE:
                out.append(flag)
        elif eq:
            if value:
                out += [flag, values[name](value) if name in values else value]
        else:
            out.append(flag)
            pending = None if boolean else values.get(name)
    return out


def tool_main(command, argv=None):
    """One of Caffe's tools (``tools/<command>``): layerforge's command of that name with the tool's gflags
    command line (:func:`gflags_argv`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    module = importlib.import_module(f"layerforge.commands.{COMMANDS[command_name(command)]}")
    parser = argparse.ArgumentParser(prog=command, description=module.HELP, formatter_class=_DefaultsHelp)
    module.add_arguments(parser)
    try:
        args = parser.parse_args(gflags_argv(parser, argv))
        return int(module.run(args) or 0)
    except LayerforgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    from .dataparallel.supervisor import needs_supervisor, supervise

    # a rank of an MPI job: its work (arguments included) runs in a child whose death by a signal is reported;
    # decided before anything heavy is imported, so that the supervisor forwards signals from its first moments
    if needs_supervisor():
        return supervise(argv)
    try:
        with interrupting():  # from here on (the command's imports included) a signal ends it in one line
            args = build_parser(argv[0] if argv and command_name(argv[0]) in COMMANDS else None).parse_args(argv)
            args.argv = argv[1:]  # the command's own arguments as given: train's restarts start it again with them
            if getattr(args, "verbose", False):
                from .logs import VERBOSE_ENV

                os.environ[VERBOSE_ENV] = "1"  # in the environment: the processes it starts show them too
            return int(args.run(args) or 0)
    except LayerforgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # an allocation no check foresaw (the blobs check theirs before allocating)
        print(f"error: {out_of_memory(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Python's own, or errors.Interrupted
        status = getattr(e, "exit_status", 128 + signal.SIGINT)
        print(f"interrupted by {signal.Signals(status - 128).name}", file=sys.stderr)
        exit_within(status)
        return status


if __name__ == "__main__":
    sys.exit(main())
