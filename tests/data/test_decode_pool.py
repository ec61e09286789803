"""DecodePool: worker processes fill batches in shared memory; results never depend on the worker count;
a failing record is raised at its batch, a dead worker is named, signals are the parent's to handle."""
import itertools
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy
import pytest

from layerforge.data.decode_pool import WORKERS_ENV, DecodePool, decode_workers
from layerforge.data.input_stats import InputStats
from layerforge.errors import DataError, LayerforgeError

BATCH = 7
LAYOUT = [((BATCH, 3), numpy.int64), ((BATCH,), numpy.float64)]


def plan(position):
    """Items (i, record) of the batch at ``position``; the extra is the position itself."""
    return [(i, position + i) for i in range(BATCH)], position


def fill(arrays, item):
    """Record r: the values (r, r * r, pid of the worker) and label r / 2; record 13 is corrupt."""
    i, record = item
    if record == 13:
        raise DataError(f"db: key '{record:08d}': corrupted record")
    if record == 23:
        raise ValueError("an unexpected failure")
    if record == 30 and os.environ.get("KILL_ON_30"):
        os.kill(os.getpid(), signal.SIGKILL)
    if record == 3:
        logging.getLogger("layerforge").warning("db: key '00000003': the image decodes with errors: X")
    arrays[0][i] = record, record * record, os.getpid()
    arrays[1][i] = record / 2


def batches(workers, count, start=0, slots=3, stats=None):
    pool = DecodePool(fill, LAYOUT, slots, workers, "layer 'd' (Data)", lambda item: f"record {item[1]}",
                      stats=stats)
    out = []
    for (values, labels), position in itertools.islice(pool.batches(plan, itertools.count(start, BATCH)), count):
        out.append((values.copy(), labels.copy(), position))
    pool.close()
    return out, pool


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_record_lands_at_its_place_whatever_the_worker_count(workers):
    got, _ = batches(workers, 1, start=14, slots=2)
    values, labels, position = got[0]
    records = numpy.arange(14, 14 + BATCH)
    numpy.testing.assert_array_equal(values[:, 0], records)
    numpy.testing.assert_array_equal(values[:, 1], records * records)
    numpy.testing.assert_array_equal(labels, records / 2)
    assert position == 14 and len(set(values[:, 2])) == workers  # each worker filled its chunk
    assert os.getpid() not in set(values[:, 2])


def test_a_failing_record_is_raised_at_its_batch_naming_it():
    pool = DecodePool(fill, LAYOUT, 3, 2, "layer 'd' (Data)", lambda item: f"record {item[1]}")
    stream = pool.batches(plan, itertools.count(0, BATCH))
    next(stream)  # records 0..6: fine, though the workers have already failed on batch 7..13
    with pytest.raises(DataError, match=r"^db: key '00000013': corrupted record$"):
        next(stream)
    assert pool.pids == [] and set(pool.exit_codes.values()) == {0}  # the generator's end stopped the workers
    stream = pool = DecodePool(fill, LAYOUT, 1, 3, "layer 'd' (Data)", lambda item: f"record {item[1]}")
    with pytest.raises(DataError, match=r"^layer 'd' \(Data\): record 23: ValueError: an unexpected failure$"):
        next(pool.batches(plan, itertools.count(21, BATCH)))


def test_a_dead_worker_is_named_with_the_record_it_was_reading(monkeypatch):
    monkeypatch.setenv("KILL_ON_30", "1")
    pool = DecodePool(fill, LAYOUT, 2, 2, "layer 'd' (Data)", lambda item: f"record {item[1]}")
    stream = pool.batches(plan, itertools.count(28, BATCH))
    start = time.perf_counter()
    with pytest.raises(DataError) as e:
        next(stream)
    assert time.perf_counter() - start < 30
    pid = re.search(r"pid (\d+)", str(e.value)).group(1)
    assert str(e.value) == (f"layer 'd' (Data): decode worker 0 (pid {pid}) was killed by signal SIGKILL while "
                            "reading record 30")


def test_warnings_of_workers_are_logged_by_the_consumer(caplog):
    with caplog.at_level(logging.WARNING, logger="layerforge"):
        batches(2, 1)
    assert [r.getMessage() for r in caplog.records] == ["db: key '00000003': the image decodes with errors: X"]


def test_stats_count_batches_images_waits_and_worker_time():
    stats = InputStats(2)
    batches(2, 4, start=35, stats=stats)
    assert (stats.batches, stats.images) == (4, 4 * BATCH)
    assert stats.decoded >= 4 * BATCH and stats.decode_s > 0 and stats.wait_s > 0
    assert stats.capacity > 0 and 0 < stats.wait_share <= 1
    assert "2 decode workers could deliver" in stats.summary()


def test_a_workers_signals_go_to_the_parent_and_workers_end_when_closed():
    """A signal sent to a worker itself (``kill PID``, a scheduler signalling every process) is the parent's to
    decide: it goes on to the parent, SIGINT as SIGTERM (the same request, never a second Ctrl-C); the worker
    serves on. A worker leads its own process group, which a signal to the parent's group does not reach."""
    got = []
    old = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        pool = DecodePool(fill, LAYOUT, 1, 2, "layer 'd' (Data)")
        stream = pool.batches(plan, itertools.count(35, BATCH))
        next(stream)
        assert [os.getpgid(pid) for pid in pool.pids] == pool.pids
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            os.kill(pool.pids[0], sig)
            deadline = time.monotonic() + 30
            while len(got) < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert got == [signal.SIGHUP if sig == signal.SIGHUP else signal.SIGTERM]
            got.clear()
        values, _ = next(stream)[0]  # still serving
        numpy.testing.assert_array_equal(values[:, 0], numpy.arange(35 + BATCH, 35 + 2 * BATCH))
        pids = list(pool.pids)
        stream.close()
        assert [pool.exit_codes[pid] for pid in pids] == [0, 0]
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# The child sets its own Ctrl-C disposition: a test run started in the background by a non-interactive shell
# inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler of its own
CHILD = textwrap.dedent("""
    import itertools, os, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    from test_decode_pool import BATCH, LAYOUT, fill, plan
    from layerforge.data.decode_pool import DecodePool
    pool = DecodePool(fill, LAYOUT, 2, 2, "layer 'd' (Data)")
    stream = pool.batches(plan, itertools.count(35, BATCH))
    next(stream)
    print(" ".join(map(str, pool.pids)), flush=True)
    while True:
        next(stream)
        time.sleep(0.01)
""")


def gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] in "ZX"  # a zombie waiting for a reaper has ended too
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("how", ["ctrl-c", "killed"])
def test_workers_end_with_their_parent(how):
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=os.path.dirname(__file__))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pids = [int(p) for p in child.stdout.readline().split()]
        assert len(pids) == 2
        if how == "ctrl-c":  # the terminal sends SIGINT to the whole foreground process group
            os.killpg(child.pid, signal.SIGINT)
        else:
            child.kill()
        _, err = child.communicate(timeout=60)
    finally:  # a failure must not leave the child serving batches for ever
        if child.poll() is None:
            child.kill()
            child.wait()
    deadline = time.time() + 30
    while not all(gone(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert all(gone(p) for p in pids)
    if how == "ctrl-c":
        assert child.returncode != 0 and err.rstrip().endswith("KeyboardInterrupt")
        assert err.count("Traceback") == 1  # the parent's own; the workers print nothing


def test_worker_count(monkeypatch):
    from layerforge.kernels import threadpool

    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert decode_workers(0) == threadpool.num_threads() and decode_workers(3) == 3
    monkeypatch.setattr(threadpool, "_state", {"threads": 5, "pool": None})  # a rank given 5 of the node's cores
    assert decode_workers(0) == 5
    monkeypatch.setenv(WORKERS_ENV, "7")  # the command line's override wins over the layer's key
    assert decode_workers(3) == 7
    monkeypatch.setenv(WORKERS_ENV, "0")
    assert decode_workers(3) == 5  # 0: one per kernel thread, whatever the key says
    monkeypatch.setenv(WORKERS_ENV, "many")
    with pytest.raises(LayerforgeError, match=f"{WORKERS_ENV} must be a whole number of workers"):
        decode_workers(0)


def test_a_worker_keeps_decoded_images_on_the_heap():
    # each decode of an image above malloc's mmap threshold faulted in fresh pages (1.30 against 0.80 ms a
    # JPEG); after keep_images_on_the_heap the pages are reused. Run in a child (it changes malloc) whose
    # threshold is glibc's default, 128 KiB, held fixed: otherwise whether glibc has raised it by itself
    # depends on what the process freed before
    script = textwrap.dedent("""
        import resource, cv2, numpy
        from layerforge.data.decode_pool import keep_images_on_the_heap
        jpeg = cv2.imencode(".jpg", numpy.random.default_rng(0).integers(0, 256, (375, 500, 3), numpy.uint8))[1]
        def faults(n=20):
            cv2.imdecode(jpeg, cv2.IMREAD_COLOR)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(n):
                cv2.imdecode(jpeg, cv2.IMREAD_COLOR)
            return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n
        default = faults()
        print(keep_images_on_the_heap(), default, faults())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env=dict({k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")},
                                  MALLOC_MMAP_THRESHOLD_="131072"))
    done, default, kept = out.stdout.split()
    assert done == "True"
    assert float(default) > 100  # 560 KB: 137 pages of 4 KiB a decode
    assert float(kept) < 5
