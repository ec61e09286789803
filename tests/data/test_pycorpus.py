"""layerforge.data.pycorpus: the stdlib token corpus (on a small stand-in stdlib, and one real check)."""
import json
import os
import zlib

import numpy
import pytest

from layerforge.data import pycorpus
from layerforge.errors import DataError

SNIPPET = '''import os  # a comment
def f(x):
    """doc"""
    return x + 1
'''


def test_tokens_of_a_snippet():
    assert pycorpus.tokens_of(SNIPPET) == [
        "import", "os", "<nl>", "def", "f", "(", "x", ")", ":", "<nl>", "<indent>", "<str>", "<nl>",
        "return", "x", "+", "1", "<nl>", "<dedent>", "<eof>"]


def fake_stdlib(root):
    files = {
        "a.py": "x = 1\ny = x + 1\n",
        "pkg/b.py": "def g(x):\n    return x * 2\n",
        "pkg/c.py": "import a\nprint(a.x)\n",
        "test/skipped.py": "never = 1\n",
        "bad.py": "def broken(:\n    pass\n",
        "d.py": "x = y = z = 1\nfor i in range(3):\n    x = x + i\n",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return files


def test_prepare_on_a_small_stdlib(tmp_path, capsys):
    fake_stdlib(tmp_path / "lib")
    out = pycorpus.prepare(vocabulary=8, directory=str(tmp_path / "corpus"), root=str(tmp_path / "lib"))
    meta = json.loads((tmp_path / "corpus" / "meta.json").read_text())
    assert [f["file"] for f in meta["failures"]] == ["bad.py"] and "bad.py" in capsys.readouterr().err
    used = ["a.py", "d.py", "pkg/b.py", "pkg/c.py"]
    heldout = [f for f in used if zlib.crc32(f.encode()) % 10 == 0]
    assert meta["files"] == {"train": len(used) - len(heldout), "heldout": len(heldout)}
    vocab = (tmp_path / "corpus" / "vocab.txt").read_text().split("\n")[:-1]
    assert len(vocab) == 8 and vocab[0] == "<unk>"
    train_tokens = [t for f in used if f not in heldout
                    for t in pycorpus.tokens_of((tmp_path / "lib" / f).read_text())]
    counts = {w: train_tokens.count(w) for w in set(train_tokens)}
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    assert vocab[1:] == ranked[:7]
    ids = numpy.load(os.path.join(out, "train.npy"))
    assert ids.tolist() == [vocab.index(t) if t in vocab else 0 for t in train_tokens]
    assert meta["tokens"]["train"] == len(train_tokens)
    # the second call finds the corpus and does not rebuild it
    mtime = os.path.getmtime(os.path.join(out, "train.npy"))
    assert pycorpus.prepare(vocabulary=8, directory=str(tmp_path / "corpus"), root="/nonexistent") == out
    assert os.path.getmtime(os.path.join(out, "train.npy")) == mtime


def test_unigram_perplexity_by_hand():
    train, heldout = numpy.array([0, 1, 1, 2]), numpy.array([1, 2])
    p = (numpy.array([1, 2, 1]) + 1) / 7.0  # add-one counts over a vocabulary of 3
    assert pycorpus.unigram_perplexity(train, heldout, 3) == pytest.approx(numpy.exp(-numpy.log(p[[1, 2]]).mean()))


@pytest.mark.parametrize("vocabulary", [1, 0, 2_000_000])
def test_bad_vocabulary(tmp_path, vocabulary):
    with pytest.raises(DataError, match="vocabulary"):
        pycorpus.prepare(vocabulary, directory=str(tmp_path / "c"))


def test_bad_split():
    with pytest.raises(DataError, match="split 'valid'"):
        pycorpus.load("valid")


def test_the_real_corpus_is_the_stdlib(tmp_path):
    ids, meta = pycorpus.load("heldout", 10000)
    again, _ = pycorpus.load("heldout", 10000)
    assert ids.dtype == numpy.int32 and ids.max() < 10000 and (ids == again).all()
    assert meta["files"]["train"] > 400 and meta["tokens"]["train"] > 10 ** 6
    assert 20 < meta["unigram_perplexity"] < 200 and meta["unknown_fraction"]["heldout"] < 0.1
