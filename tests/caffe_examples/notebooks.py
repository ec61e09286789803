"""Run Caffe's example notebooks cell by cell against ``import caffe`` -> layerforge, as a Caffe user would.

    python tests/caffe_examples/notebooks.py CAFFE_ROOT NOTEBOOK [NOTEBOOK ...]   # e.g. 01-learning-lenet siamese

``CAFFE_ROOT`` is a Caffe checkout (or a folder laid out like one: the CI test copies the few files it needs from
tests/caffe_examples/caffe/). Each notebook runs in its own process, with the folder of ``layerforge.pycaffe
--python-path`` on PYTHONPATH (the step docs/caffe-migration.md gives: its finder replaces the checkout's uncompiled
``python/caffe``), from the notebook's own folder, every code cell in one namespace, in order. Nothing is changed
but what a Caffe user without the internet, without a GPU and on today's Python and libraries must change, each
change listed below with its reason, and each checked to still apply (an edit whose text is gone is an error):

- ``py3``: Python 3 syntax (print statements, ``iteritems``, ``xrange``, integer ``/`` used as an index, text
  written to a binary temporary file), applied by :func:`port_to_python3` and per-cell edits;
- ``offline``: downloads replaced by substitutes made here (random-initialised caffemodels written by layerforge,
  layerforge's bundled MNIST digits as Caffe's LMDBs and idx files, small generated images, label lists);
- ``cpu``: ``caffe.set_mode_gpu()`` on a machine without a device (where one is present, it stays);
- ``library``: APIs that numpy, pandas, scikit-learn and SciPy removed since the notebooks were written;
- ``time``: fewer iterations where a notebook trains CaffeNet for hours on a CPU (02-fine-tuning,
  pascal-multilabel; only with ``LAYERFORGE_NOTEBOOK_QUICK=1``), and always SSD300's training batch of 2 images
  where the prototxt the fork's script writes has 4 (ssd.ipynb's one SGD step); what each cell does is unchanged.

IPython's ``%matplotlib inline`` becomes the Agg backend, ``%timeit``/``%%timeit``/``%%time`` run their statement
once, and ``!command`` lines run in a shell (``$name`` filled from the namespace) unless a notebook's shell rule
substitutes them. A cell that raises stops the run with the cell's number and the traceback.
"""
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tokenize
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


# ---------------------------------------------------------------------------------------------------------------
# reading and porting

def code_cells(path):
    """The source of every code cell of an .ipynb file, as (cell index, text)."""
    with open(path) as f:
        notebook = json.load(f)
    return [(i, "".join(c["source"])) for i, c in enumerate(notebook["cells"]) if c["cell_type"] == "code"]


def port_to_python3(text):
    """Python 2 print statements -> print() calls (``print x,`` keeps its line open), ``.iteritems()`` ->
    ``.items()``, ``xrange`` -> ``range``. Other lines are left as they are."""
    text = re.sub(r"\.iteritems\(\)", ".items()", text)
    text = re.sub(r"\bxrange\(", "range(", text)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text
    edits = []  # (row, start col, end col, replacement), applied right to left
    at_start = True
    for k, tok in enumerate(tokens):
        if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            at_start = True
            continue
        if tok.type == tokenize.COMMENT:
            continue
        statement = at_start and tok.type == tokenize.NAME and tok.string == "print"
        at_start = False
        if not statement:
            continue
        nxt = tokens[k + 1]
        if nxt.type in (tokenize.NEWLINE, tokenize.ENDMARKER) or (nxt.type == tokenize.OP and nxt.string in "(=."):
            if nxt.type != tokenize.OP:  # a bare print: an empty line
                edits.append((tok.end[0], tok.end[1], tok.end[1], "()"))
            continue
        end = next(i for i in range(k + 1, len(tokens)) if tokens[i].type in (tokenize.NEWLINE, tokenize.ENDMARKER))
        last = max((t for t in tokens[k + 1:end] if t.type not in (tokenize.COMMENT, tokenize.NL)), key=lambda t: t.end)
        if last.type == tokenize.OP and last.string == ",":  # print x,  -> no newline
            edits.append((last.start[0], last.start[1], last.end[1], ", end=' ')"))
        else:
            edits.append((last.end[0], last.end[1], last.end[1], ")"))
        edits.append((tok.end[0], tok.end[1], nxt.start[1] if nxt.start[0] == tok.end[0] else tok.end[1], "("))
    lines = text.splitlines(keepends=True)
    for row, start, stop, replacement in sorted(edits, reverse=True):
        lines[row - 1] = lines[row - 1][:start] + replacement + lines[row - 1][stop:]
    return "".join(lines)


def apply_edits(text, edits, where):
    """Replace each (old, new, reason) in ``text``; an ``old`` that is not there is an error (the edit rotted)."""
    for old, new, reason in edits:
        if old not in text:
            raise AssertionError(f"{where}: the {reason} edit {old!r} no longer applies")
        text = text.replace(old, new)
    return text


# ---------------------------------------------------------------------------------------------------------------
# IPython's syntax

def translate_ipython(text, shell_rules):
    """Cell text with magics and ``!`` lines made into Python calls of the runner's helpers."""
    lines = text.splitlines()
    if lines and lines[0].startswith("%%timeit"):  # IPython times the body in a function: its names stay local
        lines = ["def _timeit_cell():"] + ["    " + line for line in lines[1:]] + ["_timeit_cell()"]
    elif lines and lines[0].startswith("%%"):  # %%time: the body once, in the namespace
        lines = lines[1:]
    joined = []  # a ! line continued with backslashes is one command, as IPython reads it
    for line in lines:
        if joined and joined[-1].lstrip().startswith("!") and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + " " + line.strip()
        else:
            joined.append(line)
    out = []
    for line in joined:
        stripped = line.lstrip()
        indent = line[:len(line) - len(stripped)]
        if re.match(r"%\s*matplotlib\b", stripped):
            out.append(indent + "pass  # %matplotlib: the Agg backend")
        elif stripped.startswith("%timeit") or stripped.startswith("%time "):
            out.append(indent + stripped.split(None, 1)[1])
        elif stripped.startswith("!"):
            command = stripped[1:]
            for pattern, replacement in shell_rules:
                if re.search(pattern, command):
                    command = replacement(command) if callable(replacement) else replacement
                    break
            out.append(f"{indent}_shell({command!r})" if command is not None else f"{indent}pass")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def make_shell(namespace, env):
    def _shell(command):
        if command.startswith("python:"):  # a substitute written in Python, run here
            return exec(command[len("python:"):], namespace)
        command = re.sub(r"\$(\w+)", lambda m: str(namespace.get(m.group(1), m.group(0))), command)
        proc = subprocess.run(command, shell=True, capture_output=True, text=True, env=env)
        sys.stdout.write(proc.stdout)
        sys.stdout.write(proc.stderr[-3000:])
        return proc.returncode
    return _shell


# ---------------------------------------------------------------------------------------------------------------
# running

def pycaffe_env():
    """The environment of the step docs/caffe-migration.md gives: layerforge.pycaffe's folder on PYTHONPATH."""
    stand_in = os.path.join(REPO, "layerforge", "pycaffe", "python")
    paths = [stand_in, REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # packages a local run adds last (e.g. PyTables for pandas' HDF5 in the detection notebook)
    paths += [p for p in os.environ.get("LAYERFORGE_NOTEBOOK_EXTRA_PATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), MPLBACKEND="Agg")


def run_cells(notebook_path, config, cells=None):
    """Run the notebook's code cells (all, or the indices ``cells``) in one namespace; raise on the first failure."""
    import matplotlib

    matplotlib.use("Agg")
    env = pycaffe_env()
    namespace = {"__name__": "__main__"}
    namespace["_shell"] = make_shell(namespace, env)
    edits = config.get("edits", {})
    for index, text in code_cells(notebook_path):
        if cells is not None and index not in cells:
            continue
        where = f"{os.path.basename(notebook_path)} cell {index}"
        cell_edits = edits.get(index, [])
        if os.environ.get("LAYERFORGE_NOTEBOOK_QUICK") == "1":  # fewer iterations, for a machine too slow for them
            text = apply_edits(text, config.get("quick", {}).get(index, []), where)
            cell_edits = [e for e in cell_edits if e[0] in text]  # an edit of text that a quick edit replaced
        text = apply_edits(text, cell_edits, where)
        if "gpu_lines" in config:
            text = text.replace(*config["gpu_lines"])
        source = translate_ipython(port_to_python3(text), config.get("shell", []))
        print(f"----- cell {index}", flush=True)
        try:
            exec(compile(source, f"{os.path.basename(notebook_path)}[{index}]", "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            raise SystemExit(f"{os.path.basename(notebook_path)}: cell {index} failed")
        import matplotlib.pyplot as plt

        plt.close("all")
    print(f"===== {os.path.basename(notebook_path)}: all cells ran", flush=True)
    return namespace


def main(argv=None):
    import caffe_notebooks  # the notebooks' configurations and substitutes

    args = list(sys.argv[1:] if argv is None else argv)
    root = os.path.abspath(args.pop(0))
    for name in args:
        config = caffe_notebooks.NOTEBOOKS[name]
        path = os.path.join(root, config["path"])
        os.chdir(os.path.dirname(path))
        for prepare in config.get("prepare", []):
            prepare(root)
        run_cells(path, config)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.path += [p for p in os.environ.get("LAYERFORGE_NOTEBOOK_EXTRA_PATH", "").split(os.pathsep) if p]
    main()
