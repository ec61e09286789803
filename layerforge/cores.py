"""Share the cores of a node among the MPI ranks on it.

Several ranks on one node, each with a BLAS pool as large as the node, run many more threads than
cores and spend their time spinning (measured here: LeNet at 2 ranks on 2 cores went from 18 ms to 99 ms
per iteration). Under an MPI launcher, unless the user set a thread count, each rank therefore gets
``cores // ranks on this node`` BLAS/OpenMP threads (at least 1). This must run before numpy is imported.
"""
import os

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def mpi_world_size():
    """The process count of the MPI job this process was started in (1 when not under mpiexec/srun)."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def local_ranks():
    """Ranks of this MPI job on this node (1 when not launched by mpiexec/srun)."""
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "PMI_SIZE"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def local_rank():
    """This process's index among the ranks of its MPI job on this node (0 when not launched by mpiexec/srun)."""
    for var in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def limit_threads_per_rank():
    """Set the BLAS/OpenMP thread variables for a rank that shares its node; returns the count, or None."""
    ranks = local_ranks()
    if ranks <= 1 or any(v in os.environ for v in THREAD_VARS):
        return None
    threads = max(1, (os.cpu_count() or 1) // ranks)
    for var in THREAD_VARS:
        os.environ[var] = str(threads)
    return threads
