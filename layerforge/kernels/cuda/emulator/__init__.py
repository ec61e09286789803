"""An emulated CUDA device behind cupy's API, on host memory, as strict as cupy (issue 33).

``LAYERFORGE_EMULATED_GPU=1`` makes ``import layerforge`` put it in place of cupy; tests use
``with install.installed() as cupy:``. The modules, lowest first: runtime.py (devices, their memory
size, CUDA's errors), graphs.py (stream captures underway and their rules), allocations.py (exact-size
allocations and the registry of addresses), streams.py (streams, events, graphs' replay and the execution
model), device.py, memory.py (cupy's pool, allocators, pinned memory), arrays.py / functions.py
(``cupy.ndarray`` and the ``cupy`` functions), cublas.py, nccl.py, random.py, raw.py (``RawModule`` over
the kernel executor, kernel_runner.py), install.py (the switch). docs/gpu.md says what it checks and what
it does not.
"""
