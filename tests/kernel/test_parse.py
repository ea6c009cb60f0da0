"""``%gpu`` arguments: sizes in the API's terms, bad input as one line, ``--help``."""

from __future__ import annotations

import shlex

import pytest

from jupyter_gpubroker.kernel import GpuError
from jupyter_gpubroker.kernel.magic import PARSER, _HelpShown, requested_size
from jupyter_gpubroker.wire.errors import UnknownProfile


@pytest.mark.parametrize(
    ("line", "size"),
    [
        ("request 1g.10gb", {"profile": "1g.10gb"}),
        ("request 2", {"gpus": 2}),
        ("request 20GB", {"min_memory_gb": 20.0}),
        ("request --gpus 2", {"gpus": 2}),
        ("request --min-memory 20GB --class batch --no-wait", {"min_memory_gb": 20.0}),
    ],
)
def test_sizes_reach_the_api_as_one_field(line, size):
    assert requested_size(PARSER.parse_args(shlex.split(line))) == size


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("request 1g.10gb --gpus 2", "name one size: a MIG profile (1g.10gb), --gpus N"),
        ("request --gpus 0", "'gpus' must be"),
    ],
)
def test_bad_sizes_are_one_line(line, message):
    with pytest.raises(GpuError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        requested_size(PARSER.parse_args(shlex.split(line)))
    assert e.value._render_traceback_() == [str(e.value)]


def test_an_unknown_profile_is_left_for_the_magic_to_name_this_machines():
    with pytest.raises(UnknownProfile):
        requested_size(PARSER.parse_args(["request", "8g.1tb"]))


def test_bad_options_name_the_subcommand():
    with pytest.raises(GpuError) as e:
        PARSER.parse_args(["request", "--min-memory", "lots"])
    assert str(e.value) == (
        "%gpu request: argument --min-memory: the memory must be a size in GB such as 20GB "
        "(or, said so, 18.6GiB), not 'lots' (see %gpu request --help)"
    )


def test_memory_is_typed_in_gb_or_said_gib():
    assert requested_size(PARSER.parse_args(["request", "--min-memory", "20 GB"])) == {
        "min_memory_gb": 20.0
    }
    (size,) = requested_size(PARSER.parse_args(["request", "--min-memory", "18.6GiB"])).values()
    assert round(size, 2) == 19.97


def test_a_time_limit_of_zero_says_it_must_be_more_than_zero():
    """It said "up to a year, not '0'", as if 0 were too long."""
    with pytest.raises(GpuError) as e:
        PARSER.parse_args(shlex.split("request 1g.10gb --for 0"))
    assert str(e.value) == (
        "%gpu request: argument --for: the time must be more than zero, such as '2h', not '0' "
        "(see %gpu request --help)"
    )


def test_help_lists_the_commands_and_examples(capsys):
    with pytest.raises(_HelpShown):
        PARSER.parse_args(["--help"])
    usage = capsys.readouterr().out
    assert usage.startswith("usage: %gpu [-h] COMMAND ...")
    for command in ("status", "request", "release", "queue", "usage"):
        assert f"\n    {command} " in usage
    assert "%gpu request 1g.10gb --no-wait" in usage


def test_a_time_limit_in_words_is_seconds_and_a_bad_one_one_line():
    assert PARSER.parse_args(shlex.split("request 1g.10gb --for 1h30m")).limit_s == 5400
    assert PARSER.parse_args(shlex.split("request 1g.10gb")).limit_s is None
    with pytest.raises(GpuError) as e:
        PARSER.parse_args(shlex.split("request 1g.10gb --for 'a while'"))
    assert str(e.value).startswith(
        "%gpu request: argument --for: the time must be a number of seconds or a duration like"
    )
