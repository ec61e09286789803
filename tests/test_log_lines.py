"""What the log says while nothing else moves: a run of days says so with the flag that shortens it, and the lines of
detail (each convolution's engine choice) show only at a verbose level."""
import io
import logging

import pytest

from layerforge import logs
from layerforge.kernels import autotune


def test_a_run_of_days_says_so_once_with_the_flag(monkeypatch, caplog):
    clock = iter([100.0, 101.08, 102.0, 103.0])
    monkeypatch.setattr(logs.time, "monotonic", lambda: next(clock))
    run = logs.LongRun(600000)
    with caplog.at_level(logging.INFO, logger="layerforge"):
        for iteration in (1, 2, 3, 4):  # iterations done: the first ends at 100 s, the second 1.08 s later
            run.update(iteration)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["max_iter 600,000 at about 1.08 s an iteration here: 7.5 days to go; `--max-iter N` shortens "
                    "the run (about 3,333 iterations an hour)"]
    assert caplog.records[0].levelno == logging.WARNING


def test_a_run_of_hours_says_nothing():
    assert logs.long_run_line(1.08, 10000, 10000) is None
    assert logs.long_run_line(0.02, 999, 1000) is None


@pytest.mark.parametrize("verbose", ["", "1"])
def test_lines_of_detail_show_only_at_a_verbose_level(monkeypatch, verbose):
    monkeypatch.setenv(logs.VERBOSE_ENV, verbose)
    stream = io.StringIO()
    logger = logs.setup_logging(stream)
    try:
        logger.info("Convolution 'c': forward engine IM2COL (IM2COL 1.000 ms)", extra=logs.DETAIL)
        logger.info("AUTO chose engines for 2 directions")
    finally:
        for h in [h for h in logger.handlers if getattr(h, "_layerforge", False)]:
            logger.removeHandler(h)
        logger.propagate = True
    lines = stream.getvalue().splitlines()
    assert len(lines) == (2 if verbose else 1) and lines[-1].endswith("AUTO chose engines for 2 directions")
    assert autotune.DETAIL is logs.DETAIL


def test_verbose_on_the_command_line_reaches_the_processes_it_starts(monkeypatch):
    from layerforge import cli

    monkeypatch.delenv(logs.VERBOSE_ENV, raising=False)
    seen = []
    monkeypatch.setattr("layerforge.commands.layers.run", lambda args: seen.append(logs.verbose()) or 0)
    assert cli.main(["layers", "--verbose"]) == 0
    assert seen == [True]
