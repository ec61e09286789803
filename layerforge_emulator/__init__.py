"""layerforge_emulator: a stand-in for cupy and the CUDA libraries (cuBLAS, NCCL, the runtime) that runs the real
kernels on the host, as strict as cupy (issue 33). It lives beside layerforge, not in it: layerforge's code never
imports it, and it imports nothing of layerforge's; the ``.cu`` text it compiles comes to it through
``cupy.RawModule`` as it would to NVRTC.

``LAYERFORGE_EMULATED_GPU=1`` makes ``import layerforge`` put it in place of cupy (layerforge/emulated_gpu.py);
tests use ``with install.installed() as cupy:``. The modules, lowest first: runtime.py (devices, their memory
size, CUDA's errors), graphs.py (stream captures underway and their rules), allocations.py (exact-size
allocations and the registry of addresses), streams.py (streams, events, graphs' replay and the execution
model), device.py, memory.py (cupy's pool, allocators, pinned memory), arrays.py / functions.py
(``cupy.ndarray`` and the ``cupy`` functions), cublas.py, nccl.py, random.py, raw.py (``RawModule`` over
the kernel executor, kernel_runner.py), install.py (the switch). docs/gpu.md says what it checks and what
it does not.
"""
