"""Caffe-compatible log output: glog-style line prefixes so Caffe's log parsers read layerforge logs.

A line looks like ``I1121 05:12:11.123456  4242 solver.py:218] Iteration 100 ..., loss = 0.31``:
severity letter, month+day, wall time with microseconds, process id, source file:line, then the message.
"""
import datetime
import logging
import os
import sys
import time

LOGGER_NAME = "layerforge"
VERBOSE_ENV = "GLOG_v"  # glog's verbosity variable (Caffe's): 1 or more shows the lines marked DETAIL
DETAIL = {"detail": True}  # ``log.info(..., extra=DETAIL)``: a line of detail, shown only at a verbose level


def verbose():
    """True when the lines marked :data:`DETAIL` are shown: ``GLOG_v`` >= 1 (``layerforge COMMAND --verbose`` sets it,
    so that the processes a command starts show them too)."""
    value = os.environ.get(VERBOSE_ENV, "0").strip()
    return value.lstrip("-").isdigit() and int(value) >= 1


def _shown(record):
    return not getattr(record, "detail", False) or verbose()


class GlogFormatter(logging.Formatter):
    """Formats records the way glog (and so Caffe) does."""

    def format(self, record):
        t = datetime.datetime.fromtimestamp(record.created)
        return (f"{record.levelname[0]}{t:%m%d %H:%M:%S}.{t.microsecond:06d} {os.getpid():>6d} "
                f"{record.filename}:{record.lineno}] {record.getMessage()}")


class _ProgressAwareHandler(logging.StreamHandler):
    """Writes log lines above a live progress bar (tqdm.write clears and redraws it), so neither is cut."""

    def emit(self, record):
        from tqdm import tqdm

        if not getattr(tqdm, "_instances", None):
            return super().emit(record)
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging must never raise (logging.Handler's own contract)
            self.handleError(record)


def setup_logging(stream=None, level=logging.INFO):
    """Send the ``layerforge`` logger to ``stream`` (default stderr, as glog and so Caffe do) in glog format.

    Idempotent; ``layerforge train ... 2> log`` captures the whole training log. Lines marked :data:`DETAIL` (each
    convolution's engine choice) are left out unless :func:`verbose`.
    """
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    for h in list(logger.handlers):
        if getattr(h, "_layerforge", False):
            logger.removeHandler(h)
    handler = _ProgressAwareHandler(stream or sys.stderr)
    handler.setFormatter(GlogFormatter())
    handler.addFilter(_shown)
    handler._layerforge = True
    logger.addHandler(handler)
    logger.propagate = False
    return logger


LONG_RUN_S = 86400.0  # a run longer than this (a day) is said at its start, with the flag that shortens it


class LongRun:
    """Says once, at a run's start, when its iterations would take days here: timed over its second iteration (the
    first also builds what it needs), ``update(iteration)`` after each iteration as Progress gets it."""

    def __init__(self, total, start=0):
        self.total, self.start = int(total), int(start)
        self.clock, self.said = None, False

    def update(self, iteration):
        if self.said:
            return
        now = time.monotonic()
        if self.clock is None or iteration <= self.start + 1:  # the first iteration is done: its end starts the clock
            self.clock = (now, iteration)
            return
        self.said = True
        line = long_run_line((now - self.clock[0]) / max(iteration - self.clock[1], 1), self.total - iteration,
                             self.total)
        if line:
            logging.getLogger(LOGGER_NAME).warning("%s", line)


def long_run_line(seconds_per_iteration, left, total):
    """The line for a run of ``left`` more iterations (to max_iter ``total``) at ``seconds_per_iteration`` each, when
    that is longer than :data:`LONG_RUN_S`; else None."""
    seconds = seconds_per_iteration * left
    if seconds <= LONG_RUN_S:
        return None
    hour = max(1, int(3600 / seconds_per_iteration))
    return (f"max_iter {total:,} at about {seconds_per_iteration:.3g} s an iteration here: {seconds / 86400:.1f} days "
            f"to go; `--max-iter N` shortens the run (about {hour:,} iterations an hour)")


class Progress:
    """Training progress: a tqdm bar with rate and ETA on a terminal, else a status log line every ``interval`` s.

    Args:
        total: the last iteration (the solver's max_iter).
        start: the iteration training starts from (non-zero when resuming).
        stream: where the bar goes (default stderr).
        interval: seconds between status lines when ``stream`` is not a terminal; None or <= 0 means
            every ``update`` for 0, never for None.
    """

    def __init__(self, total, start=0, stream=None, interval=60.0):
        self.total, self.start = max(1, int(total)), int(start)
        self.stream = stream or sys.stderr
        self.bar = None
        self.interval = interval
        self.long_run = LongRun(total, start)
        self.t0 = self.last = time.monotonic()
        if _isatty(self.stream):
            from tqdm import tqdm

            try:
                size = os.get_terminal_size(self.stream.fileno())
                sized = size.columns > 0 and size.lines > 0
            except (OSError, ValueError, AttributeError):
                sized = False
            # a terminal that reports no size (a bare pty, a serial console) would hide tqdm's bar: assume 100x24
            self.bar = tqdm(total=self.total, initial=self.start, file=self.stream, unit="iter", mininterval=0.5,
                            dynamic_ncols=sized, ncols=None if sized else 100, nrows=None if sized else 24,
                            leave=True)

    def update(self, iteration, loss):
        """Called after each iteration with the number of iterations done and the iteration's loss."""
        self.long_run.update(iteration)
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss:.4g}", refresh=False)
            self.bar.update(iteration - self.bar.n)
            return
        now = time.monotonic()
        if self.interval is None or (now - self.last < self.interval and iteration < self.total):
            return
        self.last = now
        done = iteration - self.start
        rate = done / (now - self.t0) if now > self.t0 else 0.0
        eta = (self.total - iteration) / rate if rate > 0 else float("nan")
        logging.getLogger(LOGGER_NAME).info(
            "Progress: iteration %d/%d (%.0f%%), %.3g iter/s, ETA %s, loss = %.6g", iteration, self.total,
            100.0 * iteration / self.total, rate, _clock(eta), loss)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def clear_cut_bar(stream=None):
    """On a terminal, clear the line a progress bar of another process (a replica's, killed mid-line when the
    job failed) may have left, so that the error line starts clean; on a finished line this changes nothing."""
    stream = stream or sys.stderr
    if _isatty(stream):
        stream.write("\r\x1b[K")
        stream.flush()


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _clock(seconds):
    """``3725`` -> ``1:02:05``; ``nan`` -> ``?``."""
    if seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_bytes(nbytes):
    """``1536`` -> ``1.5 KiB``: binary units up to GiB, for messages and tables."""
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if nbytes >= size:
            return f"{nbytes / size:,.1f} {unit}"
    return f"{int(nbytes)} B"


def format_shape(shape):
    """``(64, 3, 32, 32)`` -> ``64x3x32x32``; a 0-d blob (a loss) -> ``scalar``."""
    return "x".join(map(str, shape)) if len(shape) else "scalar"
