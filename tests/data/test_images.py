"""Image decoding: OpenCV's and libjpeg's own messages never reach the terminal raw."""
import subprocess
import sys

import numpy

from layerforge.data.images import decode_image, load_image

CHILD = """
import sys, numpy, logging
from layerforge.logs import setup_logging
from layerforge.data.images import decode_image
setup_logging()
data = numpy.fromfile(sys.argv[1], dtype=numpy.uint8)
image = decode_image(data, True, sys.argv[1])
print('decoded' if image is not None else 'none', flush=True)
"""


def jpeg_bytes():
    import cv2

    image = (numpy.random.default_rng(0).random((32, 32, 3)) * 255).astype(numpy.uint8)
    return cv2.imencode(".jpg", image)[1].tobytes()


def run_child(path):
    return subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=60)


def test_broken_png_prints_nothing_of_opencvs_own(tmp_path):
    path = tmp_path / "bad.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"x" * 64)
    proc = run_child(path)
    assert proc.stdout == "none\n"
    assert proc.stderr == ""  # OpenCV's "[ERROR:0@..] global grfmt_png.cpp ..." lines are caught


def test_corrupt_jpeg_that_decodes_is_one_warning_naming_the_file(tmp_path):
    data = bytearray(jpeg_bytes())
    data[200:260] = b"\x00" * 60
    path = tmp_path / "corrupt.jpg"
    path.write_bytes(bytes(data))
    proc = run_child(path)
    assert proc.stdout == "decoded\n"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("W"), proc.stderr
    assert f"{path}: the image decodes with errors: Corrupt JPEG data" in lines[0]


def test_decode_and_load_give_chw_bgr(tmp_path):
    import cv2

    image = numpy.zeros((4, 6, 3), numpy.uint8)
    image[..., 2] = 255  # red in OpenCV's BGR order
    path = tmp_path / "red.png"
    cv2.imwrite(str(path), image)
    decoded = decode_image(path.read_bytes())
    assert decoded.shape == (3, 4, 6)
    numpy.testing.assert_array_equal(decoded[2], 255)
    numpy.testing.assert_array_equal(decoded[:2], 0)
    gray = load_image(str(path), 2, 3, is_color=False)
    assert gray.shape == (1, 2, 3)
    assert decode_image(b"") is None and load_image(str(tmp_path / "missing.png")) is None
