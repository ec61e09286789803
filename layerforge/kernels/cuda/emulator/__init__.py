"""The emulated CUDA device: cupy's API on host memory, and the .cu kernels compiled with g++ and run on the host."""
