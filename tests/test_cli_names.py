"""One naming style on the command line: commands are Caffe's tools' names (words joined by "_"), flags are
hyphenated; the old spellings (``bench-allreduce``, ``--ap_version``) keep working, and ``--stage`` takes a comma
list or the flag repeated in every command that has it (issue 51)."""
import pytest

from layerforge import cli
from layerforge.commands import stages


def parse(*argv):
    return cli.build_parser(argv[0]).parse_args(list(argv))


def test_commands_are_named_in_one_style_and_the_old_spelling_runs_the_same_command():
    assert all("-" not in name for name in cli.COMMANDS)
    new, old = parse("bench_allreduce", "--sizes", "1K"), parse("bench-allreduce", "--sizes", "1K")
    assert new.run is old.run and new.sizes == old.sizes == "1K"
    assert cli.command_name("bench-allreduce") == "bench_allreduce"


def test_both_spellings_of_ap_version_and_the_hyphenated_one_documented():
    for flag in ("--ap-version", "--ap_version"):
        assert parse("test", "--model", "m.yaml", "--weights", "w.npz", flag, "11point").ap_version == "11point"
    assert "--ap-version {" in cli.build_parser("test")._subparsers._group_actions[0].choices["test"].format_help()


@pytest.mark.parametrize("command", [
    ["train", "--solver", "s.yaml"], ["time", "--model", "m.yaml"], ["test", "--model", "m.yaml", "--weights", "w"],
    ["draw", "m.yaml"], ["export", "m.yaml", "-o", "m.onnx"],
])
def test_stage_takes_a_comma_list_or_the_flag_repeated_everywhere(command):
    listed = parse(*command, "--stage", "real,deploy", "--stage", "extra")
    repeated = parse(*command, "--stage", "real", "--stage", "deploy", "--stage", "extra")
    assert stages(listed) == stages(repeated) == ["real", "deploy", "extra"]
    assert stages(parse(*command)) == []
