"""The trace file and TensorBoard scalars of a training run (docs/trace.md), as ``--trace`` / ``--tensorboard`` or the
solver's keys ask: one process or rank records its own (:func:`start_telemetry`), a job of workers the host's part
(:func:`host_telemetry`)."""
import contextlib


class Telemetry:
    """The run's trace file and TensorBoard scalars, as ``--trace`` / ``--tensorboard`` (or the solver's
    ``trace`` / ``tensorboard`` keys) ask; both optional."""

    def __init__(self, tracing, comm, scalars):
        self.tracing, self.comm, self.scalars = tracing, comm, scalars

    def finish(self):
        if self.tracing:
            from .. import trace

            trace.finish(comm=self.comm)
            self.tracing = False

    def close(self):
        if self.tracing and self.comm is None:  # a failed single process still writes what it recorded
            self.finish()
        if self.scalars is not None:
            self.scalars.close()


def telemetry_wanted(run, sp):
    """``(trace file or None, window text, TensorBoard folder or None)`` that ``run`` asks for (its ``trace``,
    ``trace_iterations`` and ``tensorboard``: a TrainRun, or the arguments of ``layerforge time``), else the
    solver's ``trace``, ``trace_iterations`` and ``tensorboard`` keys (``sp``: the SolverParameter)."""
    return (getattr(run, "trace", None) or sp.trace, getattr(run, "trace_iterations", None) or sp.trace_iterations,
            getattr(run, "tensorboard", None) or sp.tensorboard)


def start_telemetry(run, solver, mpi_comm=None):
    """Start recording the trace and TensorBoard scalars that ``run`` and the solver file ask for."""
    from .. import trace

    path, window, logdir = telemetry_wanted(run, solver.param)
    if path:
        deadline = None
        if mpi_comm is not None:
            from ..comm.deadline import deadline_for

            deadline = deadline_for(mpi_comm, solver.param.collective_timeout)  # the exchange's, made already
        trace.start(path, trace.parse_window(window), comm=mpi_comm, xp=solver.xp, deadline=deadline)
    scalars = None
    if logdir and solver.root:
        ranks = mpi_comm.Get_size() if mpi_comm is not None else 1
        images = solver.images_per_iteration()
        scalars = solver.write_scalars(logdir, images and images * ranks)
    return Telemetry(bool(path), mpi_comm, scalars)


@contextlib.contextmanager
def host_telemetry(run, sp, comm):
    """The trace and TensorBoard scalars that ``run`` (or the keys of the SolverParameter ``sp``) ask of a job of
    workers: this process records the host's spans (pid 1000 + node) and writes the file with every worker's part;
    worker 0 writes the scalars. Yields ``train_parallel``'s ``trace`` and ``tensorboard``."""
    from .. import trace

    path, window, logdir = telemetry_wanted(run, sp)
    mpi_comm = comm.comm if comm is not None and comm.size > 1 else None
    if path:
        node = comm.rank if mpi_comm is not None else 0
        trace.start(path, trace.parse_window(window), comm=mpi_comm, pid=1000 + node,
                    process_name=f"node {node} host" if mpi_comm is not None else "host", host=True,
                    deadline=comm.deadline if mpi_comm is not None else None)
    recording = Telemetry(bool(path), mpi_comm, None)
    try:
        yield {"trace": window if path else None, "tensorboard": logdir}
        recording.finish()  # collective under mpiexec: only where every node got here
    finally:
        recording.close()
