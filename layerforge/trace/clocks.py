"""Putting every rank's spans on rank 0's clock, and bringing them to rank 0.

Each rank's monotonic clock starts at its host's boot, so ranks on different hosts disagree by hours. Rank 0
measures each other rank's offset by ping-pong (Cristian's algorithm): it reads its clock (t0), sends a
message, the rank answers with its own clock reading (tr), rank 0 reads its clock again (t1). The answer was
read somewhere between t0 and t1 on rank 0's clock, so ``offset = tr - (t0 + t1) / 2`` is wrong by at most
half the round trip ``(t1 - t0) / 2``. Of several rounds the one with the shortest round trip is kept, and
its half round trip is the reported error bound (a few microseconds over shared memory, tens over a network).
Ranks of one host read the same clock: their measured offsets are about 0, within that bound.

Clocks of different hosts also drift apart (tens of microseconds per second is common), so the offset is
measured twice, when tracing starts and when it ends, and each span is shifted by the offset interpolated
linearly to its time; the error bound given is the larger of the two measurements'.

Under the job's collective deadline (``deadline``: a :class:`layerforge.comm.deadline.Deadline`), each exchange is
one collective of it: a rank that does not come (stopped, stuck) is named and ends the job, as in training.
"""
import contextlib
import time

import numpy


TAG = 0x7ace  # the ping-pong's messages, apart from any other traffic on the communicator


# the one time base of the trace: CLOCK_MONOTONIC on Linux, shared by the processes of a host
clock = time.perf_counter


def collective(deadline, what):
    """The context of one collective ``what`` under ``deadline`` (a Deadline, or None: no deadline)."""
    return contextlib.nullcontext() if deadline is None else deadline.collective(what)


def measure_offsets(comm, rounds=8, deadline=None):
    """Every rank's clock offset against rank 0 and its error bound, in seconds; a collective call.

    Args:
        comm: an mpi4py communicator.
        rounds: ping-pong round trips per rank (the shortest is used).
        deadline: the job's collective deadline on ``comm``, or None.

    Returns:
        ``(offset, error)`` of the calling rank: its clock reads ``offset`` seconds later than rank 0's
        (subtract it to get rank 0's time), give or take ``error`` (rank 0: ``(0.0, 0.0)``).
    """
    with collective(deadline, "clock exchange of the trace"):
        return _measure_offsets(comm, rounds)


def _measure_offsets(comm, rounds):
    rank, size = comm.Get_rank(), comm.Get_size()
    table = numpy.zeros((size, 2))  # per rank: offset, error
    reading = numpy.zeros(1)
    comm.Barrier()
    if rank == 0:
        for r in range(1, size):
            best = None
            for _ in range(rounds):
                t0 = clock()
                comm.Send(reading, dest=r, tag=TAG)
                comm.Recv(reading, source=r, tag=TAG)
                t1 = clock()
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, reading[0] - (t0 + t1) / 2)
            table[r] = best[1], best[0] / 2
    else:
        for _ in range(rounds):
            comm.Recv(reading, source=0, tag=TAG)
            reading[0] = clock()
            comm.Send(reading, dest=0, tag=TAG)
    comm.Bcast(table, root=0)
    return float(table[rank, 0]), float(table[rank, 1])


def clock_point(comm, rounds=8, deadline=None):
    """``(local time, offset, error)`` in seconds: :func:`measure_offsets` and when it was measured."""
    offset, error = measure_offsets(comm, rounds, deadline)
    return clock(), offset, error


def add_clock_point(part, point):
    """Note a measured ``(local time, offset, error)`` in a recorder part's metadata."""
    clock = part["metadata"].setdefault("clock", {"points": [], "error_s": 0.0, "applied": True})
    clock["points"].append(point[:2])
    clock["error_s"] = max(clock["error_s"], point[2])


def offset_at(points, t):
    """The offset at local time ``t`` from measured ``[(time, offset), ...]``: linear between the first and the
    last measurement (the drift between them taken as steady), constant outside them."""
    if not points:
        return 0.0
    times, offsets = zip(*sorted(points))
    return float(numpy.interp(t, times, offsets))


def gather_parts(comm, parts, root=0, rounds=8, deadline=None):
    """Measure this rank's clock offset again, note it in its recorder ``parts`` (its own, and those of the
    processes of its host it absorbed) and gather every rank's parts on ``root``; a collective call.
    Returns the list of all parts on ``root``, None on the others.

    The parts are Python objects of different sizes, sent once at the end: mpi4py's pickling ``gather``.
    """
    point = clock_point(comm, rounds, deadline)
    for part in parts:
        add_clock_point(part, point)
    with collective(deadline, "gather of the trace"):
        gathered = comm.gather(parts, root=root)
    return [p for rank_parts in gathered for p in rank_parts] if gathered is not None else None
