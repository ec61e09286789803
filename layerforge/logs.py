"""Caffe-compatible log output: glog-style line prefixes so Caffe's log parsers read layerforge logs.

A line looks like ``I1121 05:12:11.123456  4242 solver.py:218] Iteration 100 ..., loss = 0.31``:
severity letter, month+day, wall time with microseconds, process id, source file:line, then the message.
"""
import datetime
import logging
import os
import sys

LOGGER_NAME = "layerforge"


class GlogFormatter(logging.Formatter):
    """Formats records the way glog (and so Caffe) does."""

    def format(self, record):
        t = datetime.datetime.fromtimestamp(record.created)
        return (f"{record.levelname[0]}{t:%m%d %H:%M:%S}.{t.microsecond:06d} {os.getpid():>6d} "
                f"{record.filename}:{record.lineno}] {record.getMessage()}")


def setup_logging(stream=None, level=logging.INFO):
    """Send the ``layerforge`` logger to ``stream`` (default stdout) in glog format; idempotent."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    for h in list(logger.handlers):
        if getattr(h, "_layerforge", False):
            logger.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(GlogFormatter())
    handler._layerforge = True
    logger.addHandler(handler)
    logger.propagate = False
    return logger


class ProgressBar:
    """A one-line progress display on a terminal (stderr), redrawn after each iteration."""

    def __init__(self, total, stream=None, width=30):
        self.total, self.stream, self.width = max(1, total), stream or sys.stderr, width
        self.start = datetime.datetime.now()

    def update(self, iteration, loss):
        done = min(1.0, iteration / self.total)
        filled = int(self.width * done)
        seconds = (datetime.datetime.now() - self.start).total_seconds()
        rate = iteration / seconds if seconds > 0 else 0.0
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {iteration}/{self.total} "
                          f"loss {loss:.4g} {rate:.1f} it/s")
        self.stream.flush()

    def close(self):
        self.stream.write("\n")
        self.stream.flush()
