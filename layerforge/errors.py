"""Errors that reach the user as one line (the CLI prints ``error: <line>`` and exits 2)."""


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
