"""OpenCV 4's Caffe importer (``cv2.dnn.readNetFromCaffe``) as an independent reference.

OpenCV 5 removed the importer; the ``dev`` extra pins ``opencv-python-headless>=4.8,<5``, so a development install
has it. Without it the reference tests fail with one line saying so (they never download anything).
"""
import pathlib

import numpy

MISSING = ("OpenCV's Caffe importer (cv2.dnn.readNetFromCaffe, OpenCV 4) is not installed: the reference tests need "
           "the dev extra (pip install -e '.[dev]', which pins opencv-python-headless>=4.8,<5)")


def require():
    """The ``cv2`` module when it has the importer; raises RuntimeError(:data:`MISSING`) otherwise."""
    import cv2

    if not hasattr(getattr(cv2, "dnn", None), "readNetFromCaffe"):
        raise RuntimeError(f"{MISSING}; this cv2 is {cv2.__version__}")
    return cv2


def run(prototxt, caffemodel, inputs, outputs):
    """``{layer: array}``: OpenCV's outputs of the layers ``outputs`` for ``inputs`` (``{input name: array}``)."""
    cv2 = require()
    net = cv2.dnn.readNetFromCaffe(str(pathlib.Path(prototxt)), str(pathlib.Path(caffemodel)))
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
    net.enableFusion(False)  # fused into a Concat, a layer's own output is not kept: every requested one must be
    for name, array in inputs.items():
        net.setInput(numpy.ascontiguousarray(array, dtype=numpy.float32), name)
    results = net.forward(list(outputs))
    return {name: numpy.array(r) for name, r in zip(outputs, results)}
