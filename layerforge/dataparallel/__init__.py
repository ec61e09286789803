"""Data parallelism: replicas that train together as one process with the total batch.

``mpi``: one replica per MPI rank, gradients exchanged by the collectives of ``layerforge.comm``, overlapped
with backward. ``cgdp``: several workers (processes or GPUs) of one host whose gradients are accumulated on
the host during backward (IBM's CPU-GPU data parallel). ``supervisor``: the parent process of an MPI rank,
which reports a rank's death and ends the job.
"""
