"""pycaffe's ``caffe.init_log`` and ``caffe.log``: Caffe's glog lines, through layerforge's logger."""
import logging

from ..logs import LOGGER_NAME, setup_logging

# glog's severities (FLAGS_minloglevel): INFO, WARNING, ERROR, FATAL
_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.CRITICAL}


def init_log(level=0, stderr=True):
    """Log glog-format lines of severity ``level`` (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL) and above to stderr.

    ``stderr=False`` is glog's default destination, files, of which stderr gets only ERROR and above (glog's
    ``stderrthreshold``); layerforge writes no log files, so those lines alone are shown.
    """
    minimum = _LEVELS.get(int(level), logging.CRITICAL)
    setup_logging(level=minimum if stderr else max(minimum, logging.ERROR))


def log(message):
    """One INFO line (Caffe's ``LOG(INFO) << message``)."""
    logging.getLogger(LOGGER_NAME).info("%s", message)
