"""One module per ``layerforge`` subcommand (``HELP``, ``add_arguments(parser)``, ``run(args)``), and the few
options several of them share."""
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
