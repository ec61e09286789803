"""The emulated CUDA device: cupy's API on host memory, and layerforge's own .cu kernels compiled with g++ and run on the host."""
