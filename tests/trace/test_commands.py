"""``layerforge trace summary|plot|merge`` through the CLI: tables, pictures, merged files, one error line."""
import argparse
import json

import pytest

from layerforge import cli
from layerforge.commands import trace as trace_command
from layerforge.trace.events import load_trace, write_trace

from .test_events import part
from .test_summary import two_ranks


@pytest.fixture
def layerforge(monkeypatch, capsys):
    """``layerforge ARGS`` in-process: (exit code, stdout, stderr). "trace" joins cli.COMMANDS here until the
    lead adds it there."""
    monkeypatch.setitem(cli.COMMANDS, "trace", "trace")

    def run(*argv):
        code = cli.main(list(map(str, argv)))
        out, err = capsys.readouterr()
        return code, out, err
    return run


@pytest.fixture
def two_rank_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(two_ranks()))
    return path


def test_summary_tables(layerforge, two_rank_file):
    code, out, err = layerforge("trace", "summary", two_rank_file)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"{two_rank_file}: 2 process(es), iterations 0-1; milliseconds per iteration"
    conv1 = next(line.split() for line in lines if line.startswith("conv1"))
    assert conv1 == ["conv1", "Convolution", "0.275", "0.125", "0.400"]
    rank1 = next(line.split() for line in lines if line.startswith("rank 1"))
    # process, iteration, busy, forward, backward, update, comm, exposed, overlap, data wait
    assert rank1 == ["rank", "1", "1.000", "0.790", "0.300", "0.150", "0.040", "0.400", "0.210", "48%", "0.150"]
    slowest = [line.split() for line in lines if line.split()[:1] in (["0"], ["1"])]
    assert slowest == [["0", "rank", "1", "0.980", "0.950", "0.030"], ["1", "rank", "0", "0.900", "0.600", "0.300"]]
    assert "(AUTO engine trials inside these: 1 spans, 0.080 ms in all)" in out


def test_summary_json(layerforge, two_rank_file):
    code, out, _ = layerforge("trace", "summary", two_rank_file, "--json")
    assert code == 0
    result = json.loads(out)
    assert [r["pid"] for r in result["ranks"]] == [0, 1] and result["per_iteration"][1]["slowest"] == 0


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_plot(layerforge, two_rank_file, tmp_path, suffix):
    out_file = tmp_path / f"timeline.{suffix}"
    code, out, _ = layerforge("trace", "plot", two_rank_file, "-o", out_file, "--iteration", 1)
    assert code == 0 and out.strip() == f"wrote {out_file} (iteration 1)" and out_file.stat().st_size > 1000


def test_merge(layerforge, tmp_path):
    clock = {"points": [(0.0, 5.0)], "error_s": 2e-6, "applied": False}
    write_trace(tmp_path / "r0.json", [part(0, [("forward", "a", 1.0, 0.5, 0)])])
    write_trace(tmp_path / "r1.json", [part(1, [("forward", "a", 6.0, 0.5, 0)], clock)])
    code, out, _ = layerforge("trace", "merge", tmp_path / "all.json", tmp_path / "r0.json", tmp_path / "r1.json")
    assert code == 0 and out.strip() == f"wrote {tmp_path / 'all.json'} (2 inputs)"
    spans = [e for e in load_trace(str(tmp_path / "all.json"))["traceEvents"] if e["ph"] == "X"]
    assert [(e["pid"], e["ts"]) for e in spans] == [(0, 1e6), (1, 1e6)]


BAD = [(b"", "the file is empty, not a trace"), (b"{\"traceEvents\": [1", "not JSON"),
       (b"{\"name\": \"a trace?\"}", "not a Chrome trace")]


@pytest.mark.parametrize("content, reason", BAD)
@pytest.mark.parametrize("action", ["summary", "plot", "merge"])
def test_bad_file_is_one_error_line(layerforge, tmp_path, content, reason, action):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    args = {"summary": [bad], "plot": [bad, "-o", tmp_path / "t.png"], "merge": [tmp_path / "m.json", bad]}[action]
    code, out, err = layerforge("trace", action, *args)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {bad}: ") and reason in err and err.count("\n") == 1
    assert not (tmp_path / "t.png").exists() and not (tmp_path / "m.json").exists()


def test_merge_into_an_input_is_refused(layerforge, two_rank_file):
    code, _, err = layerforge("trace", "merge", two_rank_file, two_rank_file)
    assert code == 2 and "the output is also an input" in err


def test_run_arguments():
    parser = argparse.ArgumentParser()
    trace_command.add_run_arguments(parser)
    args = parser.parse_args(["--trace", "t.json", "--trace-iterations", "2:4", "--tensorboard", "tb"])
    assert (args.trace, args.trace_iterations, args.tensorboard) == ("t.json", "2:4", "tb")
    assert parser.parse_args([]).trace_iterations is None  # the solver key decides (5:10 unless set)


def test_bad_window_is_a_usage_error(capsys):
    parser = argparse.ArgumentParser(prog="layerforge train")
    trace_command.add_run_arguments(parser)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--trace-iterations", "10:5"])
    assert info.value.code == 2
    assert "argument --trace-iterations: '10:5': need 0 <= A < B" in capsys.readouterr().err
