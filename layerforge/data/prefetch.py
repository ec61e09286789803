"""A background thread that produces batches ahead of the consumer, through a bounded queue.

Decoding (LMDB reads, numpy copies, cv2) mostly releases the GIL, so with a few batches queued the
training loop never waits on it. The thread holds only the producer (never the layer), so a layer that
is dropped can be collected and its thread stopped.
"""
import queue
import threading

from ..errors import DataError, LayerforgeError


class _Failure:
    def __init__(self, error):
        self.error = error


class Prefetcher:
    """Runs ``produce(job)`` for each job of ``jobs`` in a daemon thread, keeping up to ``depth`` results.

    ``get()`` returns the results in order and re-raises, in the consumer, an exception the producer
    raised (a LayerforgeError as it is; anything else as a DataError naming ``name``). ``close()``
    stops and joins the thread; it is safe to call more than once.
    """

    def __init__(self, produce, jobs, depth=4, name="data"):
        self.name = name
        self._queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(produce, iter(jobs)),
                                        name=f"prefetch:{name}", daemon=True)
        self._thread.start()

    def _run(self, produce, jobs):
        for job in jobs:
            if self._stop.is_set():
                return
            try:
                item = produce(job)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
                item = _Failure(e)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failure):
                return

    def get(self):
        """The next result; blocks until it is ready."""
        while True:
            try:
                item = self._queue.get(timeout=0.5)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise DataError(f"{self.name}: the prefetch thread has stopped") from None
        if isinstance(item, _Failure):
            self.close()
            e = item.error
            if isinstance(e, LayerforgeError):
                raise e
            raise DataError(f"{self.name}: {type(e).__name__}: {e}") from e
        return item

    def close(self):
        self._stop.set()
        while True:  # free a slot so a producer blocked in put() sees the stop flag
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def alive(self):
        return self._thread.is_alive()
