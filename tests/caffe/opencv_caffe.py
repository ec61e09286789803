"""OpenCV 4's Caffe importer (``cv2.dnn.readNetFromCaffe``) as an independent reference, run in a subprocess.

OpenCV 5 removed the importer, and an OpenCV 4 wheel cannot share an environment with the runtime's OpenCV 5,
so the tests install ``opencv-python-headless<5`` once into ``tests/.opencv4`` (``pip install --target``,
ignored by git) and run this file as a script with that folder first on ``sys.path``: it reads a prototxt and a
caffemodel, runs the inputs of an ``.npz`` through the net and writes the outputs of the named layers to an
``.npz``. Where the runtime's own cv2 still has the importer, it is used as it is.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy

TARGET = pathlib.Path(__file__).resolve().parents[1] / ".opencv4"
REQUIREMENT = "opencv-python-headless>=4.8,<5"


def _runtime_has_importer():
    import cv2
    return hasattr(cv2.dnn, "readNetFromCaffe")


def install():
    """The folder to put first on the worker's path (installing OpenCV 4 there once), or None for the runtime's cv2.

    Raises RuntimeError with pip's last lines when the install fails.
    """
    if _runtime_has_importer():
        return None
    if (TARGET / "cv2").is_dir():
        return TARGET
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".opencv4-", dir=TARGET.parent))
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                               str(staging), REQUIREMENT], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"pip could not install {REQUIREMENT} into {staging}: "
                               + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:]))
        try:
            staging.rename(TARGET)  # whole or not at all; a concurrent session may have won the race
        except OSError:
            if not (TARGET / "cv2").is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return TARGET


def run(path, prototxt, caffemodel, inputs, outputs, work_dir):
    """``{layer: array}``: OpenCV's outputs of the layers ``outputs`` for ``inputs`` (``{input name: array}``).

    ``path`` is what :func:`install` returned.
    """
    work_dir = pathlib.Path(work_dir)
    numpy.savez(work_dir / "opencv_inputs.npz", **inputs)
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path)] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, __file__, str(prototxt), str(caffemodel),
                           str(work_dir / "opencv_inputs.npz"), str(work_dir / "opencv_outputs.npz"), *outputs],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"OpenCV's Caffe importer failed: {proc.stderr.strip()[-2000:]}")
    with numpy.load(work_dir / "opencv_outputs.npz") as f:
        return {name: f[name] for name in outputs}


def main(prototxt, caffemodel, inputs, out, *layers):
    import cv2

    net = cv2.dnn.readNetFromCaffe(prototxt, caffemodel)
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
    net.enableFusion(False)  # fused into a Concat, a layer's own output is not kept: every requested one must be
    with numpy.load(inputs) as f:
        for name in f.files:
            net.setInput(numpy.ascontiguousarray(f[name], dtype=numpy.float32), name)
    results = net.forward(list(layers))
    numpy.savez(out, **{name: numpy.asarray(r) for name, r in zip(layers, results)})


if __name__ == "__main__":
    main(*sys.argv[1:])
