"""Array kernels shared by layers (im2col, convolution engines, pooling, LRN, softmax loss, BatchNorm, SSD boxes).

Each entry point dispatches on the array type: xp bodies for numpy, and for cupy arrays the CUDA kernels
of :mod:`layerforge.kernels.cuda` (compiled on first use, so importing never needs cupy).
"""
