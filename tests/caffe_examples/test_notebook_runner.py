"""The notebook runner's own pieces: the Python 3 port, IPython's syntax, edits that must still apply."""
import pytest

from .notebooks import apply_edits, port_to_python3, translate_ipython


@pytest.mark.parametrize("py2, py3", [
    ("print 'a', x\n", "print('a', x)\n"),
    ("print 'top %d' % k, # note\n", "print('top %d' % k, end=' ') # note\n"),
    ("print '\\n'.join(a\n               for a in b)\n", "print('\\n'.join(a\n               for a in b))\n"),
    ("if x:\n    print\n", "if x:\n    print()\n"),
    ("print(1)\nprint('a', 2)\n", "print(1)\nprint('a', 2)\n"),
    ("for k, v in d.iteritems(): x = xrange(3)\n", "for k, v in d.items(): x = range(3)\n"),
])
def test_port_to_python3(py2, py3):
    assert port_to_python3(py2) == py3
    compile(py3, "<cell>", "exec")


def test_ipython_lines_become_python():
    cell = "%matplotlib inline\nimport os\nif True:\n    !get_data.sh\n!cat $name\n%timeit f()\n"
    out = translate_ipython(cell, [(r"get_data\.sh", None)])
    assert out == ("pass  # %matplotlib: the Agg backend\nimport os\nif True:\n    pass\n_shell('cat $name')\nf()\n")
    assert translate_ipython("%%time\nx = 1\n", []) == "x = 1\n"
    assert translate_ipython("%%timeit\nx = 1\n", []) == "def _timeit_cell():\n    x = 1\n_timeit_cell()\n"
    continued = translate_ipython("!python a.py \\\n    --seed=1 \\\n    --n=$N\nx = 1\n", [])
    assert continued == "_shell('python a.py  --seed=1  --n=$N')\nx = 1\n"


def test_an_edit_that_no_longer_applies_is_an_error():
    assert apply_edits("a / 10", [("a / 10", "a // 10", "py3")], "nb cell 1") == "a // 10"
    with pytest.raises(AssertionError, match="nb cell 1: the py3 edit"):
        apply_edits("a // 10", [("a / 10", "a // 10", "py3")], "nb cell 1")
