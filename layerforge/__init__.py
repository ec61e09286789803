"""layerforge: Caffe-style, config-driven deep learning in Python (numpy on CPU, cupy on GPU)."""

__version__ = "0.1.0"
