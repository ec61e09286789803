"""VideoData: the SSD fork's frames of a video file or a webcam (weiliu89/caffe branch ssd)."""
import numpy

from .. import rng
from ..errors import DataError, EndOfData
from ..data.transform import DataTransformer, resolve_path
from ..schema import REQUIRED
from .base import Field, register_layer
from .data import FORK_TRANSFORM, NO_BOXES, BaseData, check_fork_transform


class VideoFrames:
    """A video file (or a webcam) read frame by frame through OpenCV; ``first`` is its first frame (C, H, W)."""

    def __init__(self, p, where):
        import cv2

        self.where, self.video = where, p.video_type == "VIDEO"
        self.source = resolve_path(p.video_file) if self.video else p.device_id
        self.name = f"video '{p.video_file}'" if self.video else f"webcam {p.device_id}"
        self.capture = cv2.VideoCapture(self.source)
        self.read_frames = 0
        frame = self.next() if self.capture.isOpened() else None
        if frame is None:
            raise DataError(f"{where}: cannot open {self.name} (missing, or no frame OpenCV can decode)")
        self.first = frame.transpose(2, 0, 1)
        if self.video:  # from the first frame again
            self.capture.release()
            self.capture, self.read_frames = cv2.VideoCapture(self.source), 0

    def next(self):
        """The next frame (H, W, C) uint8, as OpenCV decodes it, or None at the end of the video."""
        ok, frame = self.capture.read()
        if not ok or frame is None:
            return None
        self.read_frames += 1
        return frame.reshape(frame.shape[0], frame.shape[1], -1)

    def skip(self):
        """Pass over the next frame without decoding it (OpenCV's grab)."""
        if self.capture.grab():
            self.read_frames += 1

    def __len__(self):
        return 1  # one source for the stream that transforms the frames; a video is read in order, never by index

    def read(self, index):
        raise NotImplementedError("a video is read in order (VideoFrames.next)")

    def name_of(self, index):
        return f"{self.name}: frame {index}"

    def close(self):
        self.capture.release()


@register_layer("VideoData")
class VideoData(BaseData):
    """Frames of a video file, or of a webcam, in order, for running a net over a video (the fork's
    examples/ssd/ssd_pascal_video.py and ssd_pascal_webcam.py).

    Each batch takes the next ``batch_size`` frames, each after ``skip_frames`` skipped (the proto's "frames to be
    skipped before processing a frame": frames N, 2N + 1, ... of the video), transformed as a
    Data layer's images with the fork's keys (``resize_param`` and the rest: docs/data.md); the label top, when
    asked, is 0. Read in this process, in order (no decode workers). After the video's last frame the batch
    holds the frames left (fewer than ``batch_size``), and the next forward raises EndOfData, which ends
    ``layerforge test`` after the batches it ran (the fork raises SIGINT there).
    Tops: ``data`` (N, C, h, w), optional ``label`` (N,).
    """

    block = "data"
    param_blocks = {
        "data": {"batch_size": Field("int", REQUIRED, min=1, doc="frames per batch")},
        "video_data": {
            "video_type": Field("enum", "WEBCAM", choices=("WEBCAM", "VIDEO"), doc="a webcam, or a video file"),
            "device_id": Field("int", 0, min=0, doc="WEBCAM: the camera OpenCV opens"),
            "video_file": Field("str", None, doc="VIDEO: the file"),
            "skip_frames": Field("int", 0, min=0, doc="frames skipped after each frame kept"),
        },
        "transform": FORK_TRANSFORM,
    }

    @classmethod
    def validate_params(cls, lp):
        if lp.video_data.video_type == "VIDEO" and not lp.video_data.video_file:
            raise lp.error("video_type VIDEO needs video_file", "video_data.video_file")
        check_fork_transform(cls, lp)

    def layer_setup(self, bottom, top):
        p = self.layer_param.data
        where = f"layer '{self.name}' (VideoData)"
        self.batch_size = p.batch_size
        self.records = VideoFrames(self.layer_param.video_data, where)
        self.transformer = DataTransformer(self.layer_param.transform, self.phase, self.dtype, source=where)
        self.stream = self.fork_stream(p.batch_size, self.records.first, shuffle=False)
        self.seed = int(rng.get_rng().integers(2 ** 63))
        self.kept = 0  # frames handed out

    def forward(self, bottom, top):
        frames = self.records
        pictures, offsets = [], []
        while len(pictures) < self.batch_size:
            for _ in range(self.layer_param.video_data.skip_frames):  # skipped before each frame kept
                frames.skip()
            frame = frames.next()
            if frame is None:
                break
            r = numpy.random.default_rng([self.seed, self.kept])
            picture, _, offset = self.stream.transform_image(frame, NO_BOXES, r, frames.read_frames)
            pictures.append(picture)
            offsets.append(offset)
            self.kept += 1
        if not pictures:
            raise EndOfData(f"layer '{self.name}' (VideoData): {frames.name} ended after {frames.read_frames} frames "
                            f"({self.kept} kept)")
        shapes = {picture.shape for picture in pictures}
        if len(shapes) > 1:
            raise DataError(f"layer '{self.name}' (VideoData): the frames of a batch differ in shape after the "
                            f"transform ({sorted(shapes)}); give transform.resize_param or a crop, or batch_size 1")
        n = len(pictures)
        top[0].reshape((n,) + pictures[0].shape)
        plan = (numpy.array([o[0] for o in offsets]), numpy.array([o[1] for o in offsets]), numpy.zeros(n, bool))
        self.transformer.finish(self.xp, self.xp.asarray(numpy.stack(pictures)), plan, top[0].data)
        if len(top) > 1:
            top[1].reshape((n,))
            top[1].data[...] = 0
        self.top_shape = top[0].shape

    def reshape(self, bottom, top):
        top[0].reshape(self.top_shape)
        if len(top) > 1:
            top[1].reshape((self.top_shape[0],))

    def get_state(self):
        return {"type": self.type, "frames": self.records.read_frames}

    def set_state(self, state):
        raise DataError(f"layer '{self.name}' (VideoData): a video cannot be resumed at a frame")

    def close(self):
        self.records.close()
