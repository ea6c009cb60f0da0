"""docs/cli.md's table of commands is the command line's: one row per command that
``jupyter gpubroker --help`` lists, each example one the command's own parser accepts,
and "admins only" exactly where the command's help says it is for admins."""

from __future__ import annotations

import shlex
from pathlib import Path

from jupyter_gpubroker.cli.main import COMMANDS, _parser

ROOT = Path(__file__).resolve().parents[2]


def rows() -> dict[str, list[str]]:
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text.split("\n## The commands\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| `")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return {c[0].strip("`"): c[1:] for c in cells}


def test_the_table_has_one_row_per_command_in_the_order_help_lists_them() -> None:
    assert list(rows()) == [name for name, _, _ in COMMANDS]


def test_each_example_is_one_its_command_accepts() -> None:
    helps = {name: text for name, _, text in COMMANDS}
    for name, (_, example, _) in rows().items():
        argv = shlex.split(example.strip("`"))
        assert argv[:3] == ["jupyter", "gpubroker", name], example
        if name == "service":  # its options are the hub service's traitlets, its help says
            assert f"'{example.strip('`')}' lists its options" in helps[name]
            continue
        args = _parser(name).parse_args(argv[2:])
        assert callable(args.func), example


def test_admins_only_where_the_commands_help_says_so() -> None:
    helps = {name: text for name, _, text in COMMANDS}
    for name, (_, _, who) in rows().items():
        assert (who == "admins only") == helps[name].startswith("(admins)"), name
