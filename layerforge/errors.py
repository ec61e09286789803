"""Errors that reach the user as one line (the CLI prints ``error: <line>`` and exits 2), and the signals that end a
command (:func:`interrupting`: the CLI prints ``interrupted by SIGINT`` and exits 130, or 143 for SIGTERM).

Here, at the foundation, so that the command line puts :func:`interrupting` in place before it loads anything heavy;
training's own signal handling (requests carried out between iterations) is layerforge/solvers/signals.py's.
"""
import contextlib
import signal
import threading


class LayerforgeError(Exception):
    """Base of every error caused by the user's input (config, data, files)."""


class ConfigError(LayerforgeError):
    """A problem in a net or solver definition.

    The message names, where known, the file and YAML line, the layer (name and type) and the key:
    ``configs/net.yaml:12: layer 'conv1' (Convolution): key 'num_ouput': unknown key; did you mean 'num_output'?``
    """

    def __init__(self, message, path=None, line=None, layer=None, layer_type=None, key=None):
        self.message, self.path, self.line = message, path, line
        self.layer, self.layer_type, self.key = layer, layer_type, key
        super().__init__(self.format())

    def format(self):
        parts = []
        if self.path is not None:
            parts.append(f"{self.path}:{self.line}:" if self.line is not None else f"{self.path}:")
        if self.layer is not None:
            parts.append(f"layer '{self.layer}'" + (f" ({self.layer_type}):" if self.layer_type else ":"))
        if self.key is not None:
            parts.append(f"key '{self.key}':")
        parts.append(self.message)
        return " ".join(parts)


class ShapeError(LayerforgeError):
    """Raised by a layer's ``reshape`` when its bottoms cannot connect; the Net adds file, line and producers.

    ``key`` names the parameter or bottom the problem is about, when there is one.
    """

    def __init__(self, message, key=None):
        self.message, self.key = message, key
        super().__init__(message)


class DataError(LayerforgeError):
    """Unreadable or corrupted input data; the message names the source (path, database) and the record key."""


class EndOfData(DataError):
    """A source with an end (a video file) has no frame left: a command running a fixed number of batches
    (``layerforge test``) stops there and reports the batches it ran; anything else reports it in one line."""


class LabelError(DataError):
    """A label a layer cannot use; ``bottom`` and ``position`` (flat index into that bottom) let the Net name the
    record the label came from, and ``index`` (the label's index in that bottom, as the message says it) lets a
    replica of a split batch say the whole batch's."""

    def __init__(self, message, bottom, position, index=None):
        self.bottom, self.position, self.index = bottom, position, index
        super().__init__(message)


def out_of_memory(e):
    """The one line for a MemoryError ``e``: an allocation no check foresaw (the blobs check theirs first)."""
    return f"out of memory{': ' + str(e) if str(e) else ''}"


def describe_exit(code):
    """How a child process ended, from its exit code (a negative code is the signal that killed it), in words
    for a message naming it: ``"was killed by signal SIGKILL"``, ``"exited with code 1"``."""
    import signal

    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


ENDING = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM that ends a command outside the training loop; ``signum``: which."""

    def __init__(self, signum=signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def exit_status(self):
        """128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a shell reports it."""
        return 128 + self.signum


_ending = []  # the signal that is ending this process, once one came within :func:`interrupting`
_depth = [0]


def _interrupt(signum, frame):
    if not _ending:  # one Interrupted per process: a copy that follows (a decode worker forwards its Ctrl-C) is moot
        _ending.append(signum)
        raise Interrupted(signum)


@contextlib.contextmanager
def interrupting():
    """Within the block, SIGINT and SIGTERM raise :class:`Interrupted` (the previous handlers are back after it,
    unless the block left others in place: a rank's ``then_ignore``).
    A signal that came during the block wins over whatever the block did: when the block returns, or raises
    something else (a worker that the same Ctrl-C killed, a trial that fails because of it), Interrupted is raised
    instead, so that no caller takes a cut-short result, or the failure it caused, for a real one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = list(_ending)
    old = {s: signal.signal(s, _interrupt) for s in ENDING}
    _depth[0] += 1
    try:
        yield
    except Interrupted:
        raise
    except BaseException as e:
        if _ending and not before:
            raise Interrupted(_ending[0]) from e
        raise
    else:
        if _ending and not before:
            raise Interrupted(_ending[0])
    finally:
        for s, h in old.items():
            if signal.getsignal(s) is _interrupt:  # what a block set for after itself (then_ignore) stays
                signal.signal(s, h)
        _depth[0] -= 1
        if not _depth[0]:
            _ending.clear()
