"""A language-modelling corpus every machine has: the Python standard library's own source, as tokens.

The files: every ``.py`` file under the running interpreter's stdlib directory
(``sysconfig.get_paths()["stdlib"]``), walked in sorted order, leaving out test suites (``test``, ``tests``,
``idle_test``), ``lib2to3``, ``site-packages`` and ``__pycache__``. The corpus therefore depends on the
Python minor version (3.11 here: 661 files, 11.8 MB); it is prepared per version, in its own directory.

Tokens come from the standard ``tokenize`` module: names, keywords, operators and numbers are their own
text; every string literal is ``<str>`` (their contents are prose, not code); comments are dropped;
NEWLINE and NL are ``<nl>``, INDENT ``<indent>``, DEDENT ``<dedent>``; each file ends with ``<eof>``. A file
that fails to tokenize (or to read) is counted and named in ``meta.json`` and on stderr, never skipped in
silence. The vocabulary is ``<unk>`` (id 0) then the ``vocabulary - 1`` most frequent training tokens
(ties by text); other tokens become ``<unk>``.

Split, fixed: a file is held out when ``zlib.crc32(its path relative to stdlib) % 10 == 0`` (about a tenth).
:func:`prepare` writes ``<data dir>/pycorpus/py3.11-v10000/`` once (in a temporary directory renamed into
place): ``train.npy`` and ``heldout.npy`` (int32 token ids, files concatenated in order), ``vocab.txt`` (one
token per line, line k = id k) and ``meta.json`` (counts, failures, the unigram baseline perplexity).
"""
import io
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import tokenize
import zlib
from collections import Counter

import numpy

from ..errors import DataError
from . import data_dir

UNK, EOF = "<unk>", "<eof>"
SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "lib2to3", "site-packages", "__pycache__"})
_NAMED = {tokenize.STRING: "<str>", tokenize.NEWLINE: "<nl>", tokenize.NL: "<nl>", tokenize.INDENT: "<indent>",
          tokenize.DEDENT: "<dedent>"}
_DROPPED = {tokenize.COMMENT, tokenize.ENCODING, tokenize.ENDMARKER}
HELDOUT_MODULUS = 10


def source_files(root=None):
    """The stdlib ``.py`` files of the corpus, sorted: ``[(path relative to root, absolute path)]``."""
    root = root or sysconfig.get_paths()["stdlib"]
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                found.append((os.path.relpath(path, root).replace(os.sep, "/"), path))
    return found


def tokens_of(source):
    """The corpus tokens of Python source text (module docstring rules above), ending with ``<eof>``."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in _DROPPED:
            continue
        out.append(_NAMED.get(tok.type, tok.string))
    out.append(EOF)
    return out


def is_heldout(relative_path):
    return zlib.crc32(relative_path.encode()) % HELDOUT_MODULUS == 0


def unigram_perplexity(train_ids, heldout_ids, vocabulary):
    """Perplexity of the held-out ids under the training set's add-one unigram model (NaN when none)."""
    if len(heldout_ids) == 0:
        return float("nan")
    counts = numpy.bincount(train_ids, minlength=vocabulary).astype(numpy.float64) + 1.0
    log_p = numpy.log(counts / counts.sum())
    return float(numpy.exp(-log_p[heldout_ids].mean()))


def corpus_dir(vocabulary, directory=None):
    version = f"py{sys.version_info.major}.{sys.version_info.minor}"
    return os.path.abspath(directory or os.path.join(data_dir(), "pycorpus", f"{version}-v{vocabulary}"))


def prepare(vocabulary=10000, directory=None, root=None, verbose=True):
    """Write the corpus for ``vocabulary`` tokens (2 to 1,000,000) unless it exists; returns its directory."""
    if not 2 <= int(vocabulary) <= 1_000_000:
        raise DataError(f"pycorpus: vocabulary {vocabulary} must lie in [2, 1000000]")
    vocabulary = int(vocabulary)
    target = corpus_dir(vocabulary, directory)
    if os.path.exists(os.path.join(target, "meta.json")):
        return target
    streams, failures = {"train": [], "heldout": []}, []
    files = source_files(root)
    if not files:
        raise DataError(f"pycorpus: no .py files under {root or sysconfig.get_paths()['stdlib']}")
    for relative, path in files:
        try:
            with tokenize.open(path) as f:
                tokens = tokens_of(f.read())
        except (OSError, SyntaxError, UnicodeDecodeError, tokenize.TokenError, IndentationError) as e:
            failures.append({"file": relative, "error": f"{type(e).__name__}: {e}"})
            print(f"pycorpus: {path}: not used, {type(e).__name__}: {e}", file=sys.stderr)
            continue
        streams["heldout" if is_heldout(relative) else "train"].append(tokens)
    counts = Counter(t for tokens in streams["train"] for t in tokens)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:vocabulary - 1]
    words = [UNK] + [w for w, _ in ranked]
    index = {w: i for i, w in enumerate(words)}
    ids = {split: numpy.array([index.get(t, 0) for tokens in parts for t in tokens], numpy.int32)
           for split, parts in streams.items()}
    meta = {
        "python": sys.version.split()[0], "stdlib": root or sysconfig.get_paths()["stdlib"],
        "vocabulary": vocabulary, "files": {s: len(p) for s, p in streams.items()},
        "tokens": {s: int(a.size) for s, a in ids.items()},
        "unknown_fraction": {s: float((a == 0).mean()) if a.size else 0.0 for s, a in ids.items()},
        "unigram_perplexity": unigram_perplexity(ids["train"], ids["heldout"], vocabulary),
        "failures": failures,
    }
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".pycorpus-", dir=os.path.dirname(target))
    try:
        for split, a in ids.items():
            numpy.save(os.path.join(tmp, f"{split}.npy"), a)
        with open(os.path.join(tmp, "vocab.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(w.replace("\n", "\\n") for w in words) + "\n")
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: its corpus is the same
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if verbose:
        print(f"pycorpus: {meta['files']['train']} + {meta['files']['heldout']} stdlib files -> "
              f"{meta['tokens']['train']:,} train / {meta['tokens']['heldout']:,} held-out tokens, vocabulary "
              f"{vocabulary:,}; unigram perplexity of the held-out part {meta['unigram_perplexity']:.1f} "
              f"({len(failures)} file(s) not tokenized) in {target}", file=sys.stderr)
    return target


def load(split, vocabulary=10000, directory=None):
    """``(token ids (L,) int32, meta dict)`` of ``split`` ("train" or "heldout"), preparing on first use."""
    if split not in ("train", "heldout"):
        raise DataError(f"pycorpus: split '{split}' is not one of train, heldout")
    path = prepare(vocabulary, directory)
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    return numpy.load(os.path.join(path, f"{split}.npy")), meta
