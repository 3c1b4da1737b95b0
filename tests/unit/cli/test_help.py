"""`kubectl nodeflow --help` shows each command with an example of its output (issue #35)."""

from __future__ import annotations

import argparse
import re

from nodeflow_cli.main import HELP_EXAMPLES, parser


def test_rule_help_shows_every_command_with_an_example_of_its_output() -> None:
    """`kubectl nodeflow --help` (issue #35's Done when): each command the parser serves,
    then a line of what it prints."""
    top = parser()
    shown = top.format_help()
    assert HELP_EXAMPLES.splitlines()[0] in shown
    commands = next(
        action for action in top._actions if isinstance(action, argparse._SubParsersAction)
    )
    lines = HELP_EXAMPLES.splitlines()
    for name in commands.choices:
        example = re.compile(rf"^  \$ kubectl nodeflow {re.escape(name)}(\s|$)")
        at = [i for i, line in enumerate(lines) if example.match(line)]
        assert at, f"no example of `{name}`"
        following = lines[at[0] + 1]
        assert following.strip() and not following.lstrip().startswith("$"), name
