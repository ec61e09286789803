"""Fuzzing the zoo's nets and solvers: every mutated config is accepted or refused with one line per problem, never a traceback.

Mutations are made on the text (a line deleted, duplicated, swapped or cut; a value replaced by a bad one;
junk characters inserted), as a person editing YAML makes them. Each mutant goes through the same code as
``layerforge check`` (nets) or the solver's construction (solvers), in this process; anything but a
LayerforgeError escaping, or a refusal that is not one ``error: ...`` line, fails the test. Bounded: about
a minute in all (hypothesis' example counts below; no deadline per example).
"""
import contextlib
import io
import pathlib
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerforge import cli, fillers
from layerforge.errors import LayerforgeError
from tests.conftest import return_freed_memory

ROOT = pathlib.Path(__file__).resolve().parents[1]
NETS = ["lenet.yaml", "cifar10_quick_net.yaml", "cifar10_full_net.yaml", "resnet50_net.yaml"]
SOLVERS = ["lenet_solver.yaml", "cifar10_quick.yaml", "cifar10_full.yaml"]

BAD_VALUES = ["-1", "0", "1000000000000", "-1000000000000", "abc", "[]", "{}", "[1, [2]]", ".nan", ".inf", "-.inf",
              "null", "true", "'${x}'", "'${k * k * k}'", "0.5", "1e308", "\"\"", "*undefined", "&a", "!!python/none",
              "{type: xavier}", "[[1000000, 1000000]]", "'\\x00'", "~", "'9' * 99"]


@st.composite
def mutated(draw, text):
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "value", "junk", "cut", "indent"]))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "value" and ":" in lines[i]:
            head, _, _ = lines[i].rpartition(":")
            lines[i] = f"{head}: {draw(st.sampled_from(BAD_VALUES))}"
        elif op == "junk":
            k = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:k] + draw(st.sampled_from(["{", "}", "[", "]", ":", "- ", "#", "&x ", "*x", "\t",
                                                            "'", "\"", "%", "@", "`", "|", ">"])) + lines[i][k:]
        elif op == "cut":
            lines = lines[:i]
        elif op == "indent":
            lines[i] = draw(st.sampled_from(["  ", "    ", ""])) + lines[i].lstrip()
    return "\n".join(lines) + "\n"


def run_in_process(argv):
    """``layerforge argv...`` in this process: (exit code, stderr text); raises what escapes main()."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    return code, err.getvalue()


def assert_one_line_per_problem_or_accepted(code, err, path):
    """Accepted (exit 0), or exit 2 with ``error: ...`` lines (check lists each layer's problem on its own)."""
    assert code in (0, 2), (code, err)
    if code == 2:
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert lines and err.rstrip().endswith(lines[-1]), err
        assert all(len(line) <= 2000 for line in lines), lines[0][:300]


def _text(name):
    return (ROOT / "configs" / name).read_text()


def fill_a_corner(data, p):
    """The filler run on the first row and column of a parameter (all of a kernel's extent kept): its errors (a bad
    value for ``std``, a bilinear kernel that is not square) still come out, without drawing ResNet-50's 25 M
    values for every accepted mutant; check's verdict is read from the exit code and the error lines alone."""
    fillers.fill(data[:1, :1] if data.ndim >= 2 else data[:1], p)


@pytest.mark.parametrize("name", NETS)
def test_mutated_nets_give_one_line(tmp_path_factory, monkeypatch, name):
    folder = tmp_path_factory.mktemp("fuzz")
    codes = []
    monkeypatch.setattr("layerforge.layers.base.fill", fill_a_corner)

    @settings(max_examples=150 if name != "resnet50_net.yaml" else 40, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(mutated(_text(name)))
    def check(text):
        path = folder / name
        path.write_text(text, encoding="utf-8")
        code, err = run_in_process(["check", str(path)])
        return_freed_memory(collect=False)  # each accepted ResNet-50 mutant built the net: its blobs are free now
        assert_one_line_per_problem_or_accepted(code, err, path)
        codes.append(code)

    check()
    assert codes.count(2) >= len(codes) // 4, codes  # the mutations do break configs: the test is not vacuous


@pytest.mark.parametrize("name", SOLVERS)
def test_mutated_solvers_give_one_line(tmp_path_factory, name):
    from layerforge.solvers import get_solver

    folder = tmp_path_factory.mktemp("fuzz")
    for net in NETS:
        shutil.copy(ROOT / "configs" / net, folder / net)

    refused = []

    @settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(mutated(_text(name)))
    def check(text):
        path = folder / name
        path.write_text(text, encoding="utf-8")
        try:
            get_solver(str(path), max_iter=0)
            refused.append(False)
        except LayerforgeError as e:
            assert "\n" not in str(e) and len(str(e)) <= 2000, str(e)[:300]
            refused.append(True)

    check()
    assert sum(refused) >= len(refused) // 4, refused
