"""Telemetry: a per-layer, per-rank timeline of training (Chrome / Perfetto trace), its summary and picture.

Recording (every call is a no-op costing one flag check while nothing is recorded)::

    from layerforge import trace
    trace.start("run.json", iterations=(5, 10), comm=mpi_comm, xp=solver.xp)   # or comm=None
    ...                                       # the solver loop, once per iteration:
    trace.iteration(k)
    with trace.layer("forward", layer, bottom, top): ...      # per layer (Net.forward_layer)
    with trace.span("update", "sgd"): ...                     # any step: cat, name, **args
    with trace.wait("comm"): ...                              # the compute thread waiting on the exchange
    trace.complete("comm", "bucket 3", t0, seconds, {"bytes": n}, thread="comm")   # measured elsewhere
    trace.finish(comm=mpi_comm)               # writes run.json (rank 0 under mpiexec)

Reading: ``layerforge trace summary|plot|merge`` (layerforge.commands.trace), on top of
:func:`load_trace`, :func:`summarize`, :func:`plot_iteration` and :func:`merge_files`. TensorBoard scalars:
:class:`layerforge.trace.tensorboard.ScalarWriter`. docs/trace.md has the event model and the definitions.

This package imports only the foundation (errors, npz), so every layer of layerforge may call it.
"""
from .events import TraceFileError, load_trace, merge_files, merge_traces, write_trace
from .plot import plot_iteration
from .recorder import (CATEGORIES, DEFAULT_WINDOW, NULL_SPAN, WAIT_KINDS, absorb, active, begin, clock, complete,
                       current_recorder, end, finish, iteration, layer, name_thread, parse_window, rank_path, span,
                       start, stop, wait, waited)
from .summary import summarize

__all__ = ["CATEGORIES", "DEFAULT_WINDOW", "NULL_SPAN", "TraceFileError", "WAIT_KINDS", "absorb", "active", "begin",
           "clock", "complete", "current_recorder", "end", "finish", "iteration", "layer", "load_trace", "merge_files",
           "merge_traces", "name_thread", "parse_window", "plot_iteration", "rank_path", "span", "start", "stop",
           "summarize", "wait", "waited", "write_trace"]
