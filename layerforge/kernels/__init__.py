"""Array kernels shared by layers (im2col, pooling): xp bodies that run on numpy and cupy alike."""
