"""One module per ``layerforge`` subcommand (``HELP``, ``add_arguments(parser)``, ``run(args)``), and the few
options several of them share."""
import argparse
import os


def add_decode_workers(parser):
    """``--decode-workers N`` (train, test, time)."""
    parser.add_argument("--decode-workers", type=int, metavar="N",
                        help="decode worker processes per image data layer (0: one per core's share); overrides "
                             "the layers' decode_workers")


def apply_decode_workers(args):
    """Set ``--decode-workers`` for every data layer built from now on, in this process and the ones it starts
    (MPI ranks inherit it from mpiexec's environment only when given there; CGDP workers inherit it)."""
    n = getattr(args, "decode_workers", None)
    if n is not None:
        if n < 0:
            from ..errors import LayerforgeError
            raise LayerforgeError(f"--decode-workers {n}: give 0 (the default) or a positive count")
        from ..data.decode_pool import WORKERS_ENV
        os.environ[WORKERS_ENV] = str(n)


def add_collective_timeout(parser, default):
    """``--collective-timeout SECONDS`` (train, time); ``default``: what it overrides, in words."""
    parser.add_argument("--collective-timeout", type=float, metavar="SECONDS",
                        help="end the job, naming the late rank (CPU replica, worker) and its host, when a collective "
                             f"or a wait on a peer lasts this long from the first arrival ({default}; 0: none; "
                             "docs/distributed.md)")


class _Stages(argparse.Action):
    """``--stage a,b`` and ``--stage a --stage b`` alike: the stages in order, one list."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(getattr(namespace, self.dest) or []) + [s for s in values.split(",") if s])


def add_stage(parser):
    """``--stage S[,S...]``, repeatable (train, test, time, draw, export): the net's NetState stages."""
    parser.add_argument("--stage", action=_Stages, default=[], metavar="S[,S...]",
                        help="the net's NetState stages (Caffe's -stage): a comma-separated list, or the flag "
                             "repeated")


def add_net_state(parser):
    """``--level N`` and ``--stage S[,S...]`` (train, test, time): the NetState that include / exclude rules
    read, as Caffe's ``-level`` and ``-stage``."""
    parser.add_argument("--level", type=int, metavar="N", help="the net's NetState level (Caffe's -level)")
    add_stage(parser)


def stages(args):
    """The stages ``--stage`` gave (a list; a comma-separated string where a caller built ``args`` itself)."""
    given = getattr(args, "stage", None) or []
    return [s for s in given.split(",") if s] if isinstance(given, str) else list(given)


def net_state(args):
    """``{"level": ..., "stages": [...]}`` for Net(): what --level / --stage give (Caffe's default level 0)."""
    return {"level": getattr(args, "level", None), "stages": stages(args)}


def train_state(args):
    """``{"train_state": {...}}`` for a solver's overrides when --level / --stage are given, else {}."""
    given = net_state(args)
    state = dict({} if given["level"] is None else {"level": given["level"]},
                 **({"stage": given["stages"]} if given["stages"] else {}))
    return {"train_state": state} if state else {}
