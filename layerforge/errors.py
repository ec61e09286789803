"""Errors that reach the user as one line (the CLI prints ``error: <line>`` and exits 2), and the signals that end a
command (:func:`interrupting`: the CLI prints ``interrupted by SIGINT`` and exits 130, or 143 for SIGTERM).

Before that, from the package's first line, :func:`interrupting_start_up` ends the ``layerforge`` command in one
line too (``interrupted during start-up (SIGINT)``). Here, at the foundation, so that the command line puts
:func:`interrupting` in place before it loads anything heavy;
training's own signal handling (requests carried out between iterations) is layerforge/solvers/signals.py's.
"""
import contextlib
import os
import signal
import sys
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


def _started_as_the_command():
    """Whether this process is the ``layerforge`` command (its console script, ``python -m layerforge``), not a
    program that imports layerforge: only the command may take over the process's signals."""
    if sys.argv[:1] == ["-m"]:  # python -m PACKAGE while the package is imported (runpy names the file later)
        argv = getattr(sys, "orig_argv", [])
        return "-m" in argv[:-1] and argv[argv.index("-m") + 1] == "layerforge"
    program = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if program == os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py"):  # python -m, once run
        return True
    return os.path.splitext(os.path.basename(program))[0] == "layerforge"


def interrupting_start_up():
    """In the ``layerforge`` command, from the first line of the package on: until the command puts its own handlers
    in place (:func:`interrupting`, a rank's supervisor), SIGINT or SIGTERM ends the process at once with one line,
    ``interrupted during start-up (SIGINT)``, and 128 + the signal, instead of a KeyboardInterrupt traceback from
    the middle of an import or SIGTERM's silent death. Elsewhere (a program that imports layerforge), nothing."""
    if _started_as_the_command() and threading.current_thread() is threading.main_thread():
        for s in ENDING:
            signal.signal(s, _interrupted_during_start_up)


def _interrupted_during_start_up(signum, frame):
    # os._exit: nothing has begun yet that an orderly exit would have to finish, and an import half done is no
    # place to raise
    os.write(2, f"interrupted during start-up ({signal.Signals(signum).name})\n".encode())
    os._exit(128 + signum)


_AFTER_START_UP = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}  # Python's own
_ending = []  # the signal that is ending this process, once one came within :func:`interrupting`
_depth = [0]
_unraisable_hook = [None]  # sys.unraisablehook before the outermost interrupting()
_again = {"in_hook": False, "signum": None, "timer": None}  # _interrupt_again's state
_deferred = {"depth": 0, "signum": None}  # deferring_interrupts's state
_after_interrupt = []  # after_interrupt's callbacks
AGAIN_AFTER = 0.01  # seconds after which a swallowed Interrupted is delivered again (the hook has long returned)


def _interrupt(signum, frame):
    if _again["in_hook"]:  # within _interrupt_again: raised there it would be swallowed too; it comes again after
        _again["signum"] = signum
        return
    if _deferred["depth"]:  # raised as deferring_interrupts ends
        _deferred["signum"] = _deferred["signum"] or signum
        return
    if not _ending or _again["timer"] is not None and _ending == [signum]:  # the first, or its second delivery
        _again["timer"] = None
        _ending[:] = [signum]
        raise Interrupted(signum)
    # one Interrupted per process: a copy that follows (a decode worker forwards its Ctrl-C) is moot


def _interrupt_again(unraisable):
    """``sys.unraisablehook`` within :func:`interrupting`. An Interrupted raised where Python can only print it and
    go on (a weakref callback of the import machinery, a ``__del__``: "Exception ignored in ...", a traceback) is
    not printed: the signal is sent again a moment later, to be raised where it ends the command (and if the block
    ends first, it raises it there, as for any signal that came during it)."""
    e = unraisable.exc_value
    if not (isinstance(e, Interrupted) and signal.getsignal(e.signum) is _interrupt):
        _unraisable_hook[0](unraisable)
        return
    _again["in_hook"], _again["signum"] = True, e.signum
    try:
        while _again["signum"] is not None:
            signum, _again["signum"] = _again["signum"], None
            _again["timer"] = threading.Timer(AGAIN_AFTER, os.kill, (os.getpid(), signum))
            _again["timer"].daemon = True
            _again["timer"].start()
    finally:
        _again["in_hook"] = False


@contextlib.contextmanager
def deferring_interrupts():
    """Within the block, a signal that :func:`interrupting` turns into Interrupted waits, and is raised as the block
    ends: for steps that must all happen or none, such as making a resource and recording it where its cleanup finds
    it (raised between the two, at any bytecode, it would leak what the first made). Keep the block short and
    free of waits: the signal ends the command only after it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python runs signal handlers in the main thread only: nothing interrupts this one
        return
    _deferred["depth"] += 1
    try:
        yield
    finally:
        _deferred["depth"] -= 1
        signum = _deferred["signum"]
        if not _deferred["depth"] and signum is not None:
            _deferred["signum"] = None
            _interrupt(signum, None)


def after_interrupt(fn):
    """Have ``fn()`` called on the main thread when a signal ends the command, as its Interrupted leaves the
    outermost :func:`interrupting` block (kernels/compile_lock.py lets go there of the locks a signal left held)."""
    _after_interrupt.append(fn)


# seconds a process that a signal ended (its line printed) may take to exit before it is made to
EXIT_WITHIN = 10.0


def exit_within(status):
    """Once a signal has ended the command (its line printed): if the process has not exited :data:`EXIT_WITHIN`
    seconds from now, end it at once with ``status`` (os._exit, what stdout holds written first). Its exit waits for
    every thread that is not a daemon's, and one may wait for a lock the signal left held where it came (a lock taken
    in a Python-level ``__enter__`` is held from the acquire to the block's start): before, the line printed, and no
    exit. Only in the ``layerforge`` command: a program that called its ``main`` goes on."""
    if not _started_as_the_command():
        return
    sys.stdout.flush()
    timer = threading.Timer(EXIT_WITHIN, os._exit, (status,))
    timer.daemon = True
    timer.start()


def raise_if_ending():
    """On a thread other than the main one (which a signal never interrupts), raise Interrupted where a signal is
    ending the command (:func:`interrupting` raised it on the main thread): for a wait that is then moot, and that
    the main thread may be waiting for. Nothing on the main thread, or while no signal came."""
    if _ending and threading.current_thread() is not threading.main_thread():
        raise Interrupted(_ending[0])


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
    old = {s: _AFTER_START_UP[s] if h is _interrupted_during_start_up else h for s, h in old.items()}
    if not _depth[0]:
        _unraisable_hook[0], sys.unraisablehook = sys.unraisablehook, _interrupt_again
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
            if _ending:  # the block raises Interrupted (a signal wins over whatever it did)
                for fn in _after_interrupt:
                    fn()
            _ending.clear()
            sys.unraisablehook = _unraisable_hook[0]
            if _again["timer"] is not None:  # the block raised it already
                _again["timer"].cancel()
                _again["timer"] = None
