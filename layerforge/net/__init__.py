"""The net: definitions (netdef, blocks), the Net that builds and runs the layers (net), and what works on a
whole net (fusion of BatchNorm chains, the memory plan, drawing, reading Caffe prototxt nets)."""
from .net import Net

__all__ = ["Net"]
