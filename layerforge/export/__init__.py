"""Exporters of a built Net to other formats (ONNX)."""
