"""Data pipeline: LMDB records, image lists, transforms, batch order, prefetching and the MNIST default set.

The layers that use it are in ``layerforge/layers/data.py``; docs/data.md describes the formats.
"""
import os


def read_text(path, what, shown=None):
    """The text of the UTF-8 file ``path``; a one-line DataError ``"<shown or path>: cannot read the <what>:
    <reason>"`` when it cannot be read."""
    from ..errors import DataError
    try:
        with open(path, "r", encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{shown or path}: cannot read the {what}: {getattr(e, 'strerror', None) or e}") from None


def repo_root():
    """The directory that holds the ``layerforge`` package (the repository root of a checkout)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def data_dir():
    """Where generated data go: ``$LAYERFORGE_DATA_DIR``, else ``<repo>/data`` in a checkout, else ``./data``."""
    if os.environ.get("LAYERFORGE_DATA_DIR"):
        return os.environ["LAYERFORGE_DATA_DIR"]
    root = repo_root()
    return os.path.join(root if os.path.exists(os.path.join(root, "pyproject.toml")) else os.getcwd(), "data")
