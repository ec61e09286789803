"""Launch guard: an uncaught error on any rank ends the whole MPI job instead of leaving the others hanging.

``python -m mpi4py`` arranges the same: a rank that dies in Python while its peers wait in a collective
would otherwise deadlock the job (or hang in MPI_Finalize). The guard prints ``rank R: <reason>`` on stderr
and calls ``MPI_Abort``, so ``mpiexec`` kills every rank and exits non-zero. An MPI error (a peer that died inside a
collective) is not reported at once: the launcher ends the job first, and the dead rank is named once, by its
supervisor.
"""
import contextlib
import functools
import os
import sys
import time
import traceback

from ..errors import LayerforgeError
from ..launcher import read_by_the_launcher


def abort(reason, code=1, comm=None, details=None):
    """Print ``rank R: reason`` (then ``details``, e.g. a traceback; nothing for a None ``reason``) and abort ``comm``
    (default COMM_WORLD) with exit ``code``; never returns.

    The one line goes first: MPI_Abort can kill the job before mpiexec has forwarded everything a rank wrote
    last (seen at 4 ranks on 2 busy cores), and the line is what the user needs. On COMM_WORLD, MPICH's abort is a
    PMI ``abort`` to hydra, which exits with exactly ``code`` however the other ranks end (launcher.py); on another
    communicator it only tells that one's ranks, and hydra's status would mix theirs with those it kills.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    sys.stdout.flush()
    if reason is not None:  # None: this rank said it already
        print(f"rank {comm.Get_rank()}: {reason}", file=sys.stderr, flush=True)
    if details:
        print(details, file=sys.stderr, end="", flush=True)
    read_by_the_launcher(sys.stderr)
    comm.Abort(code)
    # MPI_Abort returns: on COMM_WORLD, MPICH only sends hydra the abort; elsewhere, when the job is already being
    # ended by another rank's abort. This rank must not go on (the guard would print the error again, with a traceback)
    os._exit(code)


@contextlib.contextmanager
def launch_guard(comm=None):
    """Context for a distributed entry point; on a single rank errors propagate unchanged.

    Example::

        with launch_guard():
            train(args)
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    try:
        yield comm
    except SystemExit as e:
        if e.code in (None, 0) or comm.Get_size() == 1:
            raise
        # a deadline one host's workers missed was said in one line already (dataparallel/cgdp/waits.py)
        abort(None if e.code == DEADLINE_STATUS else f"exit status {e.code}", e.code if isinstance(e.code, int) else 1, comm)
    except BaseException as e:  # noqa: BLE001 - every escape must reach MPI_Abort
        if comm.Get_size() == 1:
            raise
        if isinstance(e, MPI.Exception):
            _wait_for_the_launcher()
        if isinstance(e, LayerforgeError):
            abort(f"error: {e}", 2, comm)
        if isinstance(e, KeyboardInterrupt):
            abort("interrupted", 130, comm)
        abort(f"{type(e).__name__}: {e}", 1, comm, details=traceback.format_exc())


DEADLINE_STATUS = 124  # a collective, or a wait on a peer, ran past its deadline (deadline.py; GNU timeout's status)
PEER_LOST_GRACE = 10.0  # seconds an MPI error waits for the launcher to end the job, before it is reported


def _wait_for_the_launcher(grace=PEER_LOST_GRACE):
    """An MPI error in a communication is, nearly always, a peer that died inside it ("Other MPI error"): its
    supervisor names it (supervisor.py) and the launcher ends the job within a second or so. This rank then adds
    nothing, no second line and no traceback: it waits here to be ended. An MPI error that is this rank's own
    (the job goes on) is reported after ``grace`` seconds, as any other error."""
    time.sleep(grace)


def guarded(fn):
    """Decorator form of :func:`launch_guard`; a non-zero return on one rank of several also aborts."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with launch_guard() as comm:
            code = fn(*args, **kwargs)
            if code and comm.Get_size() > 1:
                abort(f"exit status {code}", int(code), comm)
            return code

    return wrapper
