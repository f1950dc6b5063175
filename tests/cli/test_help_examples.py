"""Every `alibi <command> --help` ends with at least one example, and every example is a valid invocation.

The commands are found by walking the real parser (`alibi.cli.build_parser`), so a command added
without an example fails here. "Valid" means the example parses with alibi's own parser: the
command exists, every option is one it takes, every choice is allowed, nothing is left over.
"""

from __future__ import annotations

import shlex

import pytest

from alibi.cli import build_parser, main
from alibi.cli.examples import EXAMPLES, command_parsers

COMMANDS = sorted(command_parsers(build_parser()))


def test_the_walk_finds_every_command_group_and_leaf():
    assert len(COMMANDS) >= 40
    assert {"conform", "kernels build", "replay teacher-forced", "prereg evaluate", "report html"} <= set(COMMANDS)


def test_every_example_names_an_existing_command():
    assert sorted(set(EXAMPLES) - set(COMMANDS)) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_help_ends_with_an_example_of_that_command(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([*command.split(), "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    tail = out[out.rindex("\nexample"):].strip().splitlines()
    assert tail[0] in ("example:", "examples:")
    examples = [line.strip() for line in tail[1:]]
    assert examples and all(e.startswith(f"alibi {command} ") or e == f"alibi {command}" for e in examples)
    assert EXAMPLES.get(command, examples[0]) in examples  # a leaf shows its own, a group its commands'


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_each_example_parses_with_alibis_own_parser(command):
    argv = shlex.split(EXAMPLES[command])
    assert argv[0] == "alibi"
    try:
        args, extra = build_parser().parse_known_args(argv[1:])
    except SystemExit as exc:  # a usage error: argparse already printed which argument
        pytest.fail(f"{EXAMPLES[command]!r} does not parse (exit {exc.code})")
    assert extra == []
    assert callable(args.func)
