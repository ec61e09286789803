"""Image files listed in a text file of ``path label`` lines (Caffe's ImageData / convert_imageset input)."""
import contextlib
import logging
import os
import sys
import tempfile
import threading

import numpy

from ..errors import DataError
from . import read_text

log = logging.getLogger("layerforge")
_stderr_lock = threading.Lock()
_stderr_for_good = []  # in a decode worker process: the private file its fd 2 points at for the process's life


def catch_stderr_for_good():
    """Point this process's fd 2 at a private file for the rest of its life (a decode worker process, where
    nothing else writes there): :func:`decode_image` then reads each image's messages from it, without the
    per-image redirection and the lock that keep decodes of one process apart."""
    caught = tempfile.TemporaryFile()
    os.dup2(caught.fileno(), 2)
    _stderr_for_good.append(caught)


@contextlib.contextmanager
def _stderr_caught():
    """Yields a list that receives, on exit, what was written to fd 2 meanwhile, as one line."""
    messages = []
    if _stderr_for_good:
        caught = _stderr_for_good[0]
        try:
            yield messages
        finally:
            if os.lseek(2, 0, os.SEEK_CUR):  # fd 2 and ``caught`` share one offset: anything written moved it
                caught.seek(0)
                messages.append(" ".join(caught.read().decode(errors="replace").split()))
                caught.seek(0)
                caught.truncate()
        return
    with _stderr_lock, tempfile.TemporaryFile() as caught:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            yield messages
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = " ".join(caught.read().decode(errors="replace").split())
            if text:
                messages.append(text)


def decode_image(data, is_color=True, name=None):
    """Encoded image bytes (JPEG, PNG, ...) -> a (C, H, W) array (BGR, or one channel), or None.

    ``is_color``: True for 3 channels, False for one, None for the file's own (OpenCV's IMREAD_UNCHANGED:
    any channel count and bit depth, as Caffe's DecodeDatumToCVMatNative reads a Datum).

    OpenCV's own log lines and libjpeg's messages, which both go straight to the process's stderr (fd 2),
    are caught: a message from an image that still decodes becomes one warning naming ``name`` (the file or
    record), and nothing is printed for one that does not (the caller reports that with its own line).
    """
    import cv2

    data = numpy.frombuffer(data, numpy.uint8) if not isinstance(data, numpy.ndarray) else data
    if not data.size:
        return None
    flag = cv2.IMREAD_UNCHANGED if is_color is None else (cv2.IMREAD_COLOR if is_color else cv2.IMREAD_GRAYSCALE)
    with _stderr_caught() as messages:
        image = cv2.imdecode(data, flag)
    if image is None:
        return None
    if messages:
        log.warning("%s: the image decodes with errors: %s", name or "image", messages[0][:300])
    return image[None] if image.ndim == 2 else image.transpose(2, 0, 1)


def load_image(path, height=0, width=0, is_color=True, nearest=False):
    """An image file as a (C, H, W) uint8 array (BGR, or one channel), resized when height and width are set
    (bilinear, or nearest-neighbour with ``nearest``: a label image's class indices stay class indices).

    Returns None when OpenCV cannot read the file.
    """
    import cv2
    try:
        data = numpy.fromfile(path, dtype=numpy.uint8)
    except OSError:
        return None
    image = decode_image(data, is_color, path)
    if image is None:
        return None
    if height > 0 and width > 0 and image.shape[1:] != (height, width):
        interpolation = cv2.INTER_NEAREST if nearest else cv2.INTER_LINEAR
        image = cv2.resize(image.transpose(1, 2, 0), (width, height), interpolation=interpolation)
        image = image[None] if image.ndim == 2 else image.transpose(2, 0, 1)
    return image


_SAME_TYPE = {"jpeg": "jpg"}


def encoded_bytes(image, path, kind=None, changed=False):
    """The bytes of an encoded image record (as convert_imageset --encoded stores it): the file at ``path`` itself
    when its type is ``kind`` (default: its own) and the pixels were not ``changed`` (resized, made grey), else
    ``image`` (C, H, W) encoded as ``kind`` by OpenCV."""
    import cv2
    own = os.path.splitext(path)[1][1:].lower()
    own = _SAME_TYPE.get(own, own)
    kind = _SAME_TYPE.get(kind, kind) if kind else own
    if not changed and kind == own:
        return numpy.fromfile(path, dtype=numpy.uint8).tobytes()
    ok, data = cv2.imencode("." + kind, image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0))
    if not ok:
        raise DataError(f"image '{path}': cannot encode it as {kind}")
    return data.tobytes()


def _list_lines(list_file):
    """``[(line number, stripped line), ...]`` of a list file's entries (blank and ``#`` lines left out)."""
    lines = read_text(list_file, "image list").splitlines()
    entries = [(number, line.strip()) for number, line in enumerate(lines, 1)
               if line.strip() and not line.lstrip().startswith("#")]
    if not entries:
        raise DataError(f"{list_file}: the image list is empty")
    return entries


def read_list_file(list_file):
    """``[(path, label, line_number), ...]`` from a list file; a path may contain spaces (the label is last)."""
    entries = []
    for number, line in _list_lines(list_file):
        parts = line.rsplit(None, 1)
        try:
            entries.append((parts[0], int(parts[1]), number))
        except (IndexError, ValueError):
            raise DataError(f"{list_file}:{number}: expected 'path label' with an integer label, "
                            f"got {line!r}") from None
    return entries


def read_pair_list_file(list_file, expected="image_path label_image_path"):
    """``[(first path, second path, line_number), ...]`` from a list file of two paths a line, without spaces: the
    SegNet fork's DenseImageData source (image, label image), the SSD fork's detection lists (image, annotation);
    ``expected`` names the two fields in the error for a line that has not two."""
    entries = []
    for number, line in _list_lines(list_file):
        parts = line.split()
        if len(parts) != 2:
            raise DataError(f"{list_file}:{number}: expected '{expected}', got {line!r}")
        entries.append((parts[0], parts[1], number))
    return entries


def folder_entries(root):
    """``([(relative path, label, 0), ...], class_names)`` for an image folder whose subfolders are classes."""
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a folder")
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    if not classes:
        raise DataError(f"{root}: no class subfolders")
    entries = []
    for label, name in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(os.path.join(root, name))):
            for f in sorted(files):
                entries.append((os.path.relpath(os.path.join(dirpath, f), root), label, 0))
    return entries, classes


class ImageList:
    """Random access to the images of a list file: ``len()``, ``read(index)``, ``name_of(index)``."""

    read_entries = staticmethod(read_list_file)  # ``[(image path, label, line number), ...]`` of the list file

    def __init__(self, list_file, root_folder="", height=0, width=0, is_color=True):
        self.list_file, self.root_folder = str(list_file), root_folder or ""
        self.height, self.width, self.is_color = height, width, is_color
        self.entries = self.read_entries(self.list_file)

    def __len__(self):
        return len(self.entries)

    def name_of(self, index):
        path, _, number = self.entries[index]
        return f"{self.list_file}:{number}: image '{os.path.join(self.root_folder, path)}'"

    def read(self, index):
        """``(image (C, H, W) uint8, label)``; DataError naming the list file and line when it cannot be read."""
        return self.read_image(index), self.entries[index][1]

    def read_image(self, index):
        """The image of entry ``index`` (C, H, W) uint8; DataError naming the list file and line when unreadable."""
        image = load_image(os.path.join(self.root_folder, self.entries[index][0]), self.height, self.width,
                           self.is_color)
        if image is None:
            raise DataError(f"{self.name_of(index)}: cannot read the image (missing, or not an image)")
        return image


class DenseImageList(ImageList):
    """Random access to the (image, label image) pairs of a list file of ``image label_image`` lines. Label images
    are read as one grey channel and resized nearest-neighbour, as the SegNet fork reads them;
    ``label_divide_factor`` (ENet's) reads them at the new height and width divided by it."""

    read_entries = staticmethod(read_pair_list_file)

    def __init__(self, list_file, root_folder="", height=0, width=0, is_color=True, label_divide_factor=1):
        super().__init__(list_file, root_folder, height, width, is_color)
        self.factor = label_divide_factor

    def read(self, index):
        """``(image (C, H, W) uint8, label image (1, H, W) uint8)``; DataError naming the list file, line and path
        when either cannot be read or their sizes differ."""
        image = self.read_image(index)
        _, label_path, number = self.entries[index]
        label_path = os.path.join(self.root_folder, label_path)
        label = load_image(label_path, self.height // self.factor, self.width // self.factor, False, nearest=True)
        if label is None:
            raise DataError(f"{self.list_file}:{number}: label image '{label_path}': cannot read the image "
                            "(missing, or not an image)")
        want = (image.shape[1] // self.factor, image.shape[2] // self.factor)
        if label.shape[1:] != want:
            divided = f" (label_divide_factor {self.factor}: {want[0]}x{want[1]})" if self.factor > 1 else ""
            raise DataError(f"{self.list_file}:{number}: label image '{label_path}' is {label.shape[1]}x"
                            f"{label.shape[2]}, its image is {image.shape[1]}x{image.shape[2]}; they must match"
                            + divided)
        return image, label
