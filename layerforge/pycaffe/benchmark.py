"""pycaffe's ``caffe.Timer`` (Caffe's util/benchmark.hpp): milliseconds between ``start()`` and ``stop()``."""
import logging

from ..backend import Stopwatch
from ..logs import LOGGER_NAME
from . import mode


class Timer:
    """``t.start(); ...; t.stop(); t.ms``: host time in CPU mode, device time (CUDA events) in GPU mode.

    As Caffe's: ``start`` while running and ``stop`` while stopped do nothing; reading ``ms`` stops a running
    timer; ``ms`` before any ``start`` is 0 with a warning.
    """

    def __init__(self):
        self._watch = Stopwatch(mode.array_module())
        self._running, self._ms = False, None

    def start(self):
        if not self._running:
            self._watch.start()
            self._running = True

    def stop(self):
        if self._running:
            self._ms = self._watch.stop() * 1000.0
            self._running = False

    @property
    def ms(self):
        """Milliseconds of the last start..stop (float)."""
        if self._ms is None and not self._running:
            logging.getLogger(LOGGER_NAME).warning("Timer has never been run before reading time.")
            return 0.0
        self.stop()
        return self._ms
