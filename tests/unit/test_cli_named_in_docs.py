"""Every `atelier …` command the docs, the README and the alert rules name is one the CLI
has (an alert that tells an operator to run a command that does not exist wastes the
minutes that matter)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from services.cli import parser

ROOT = Path(__file__).resolve().parents[2]
NAMING = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAMING += sorted((ROOT / "deploy" / "observability").glob("*.yml"))
# A command in backticks: `atelier push doctor ...`.
NAMED = re.compile(r"`atelier ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")


def subcommands(command: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def unknown_commands(text: str) -> list[str]:
    commands = subcommands(parser())
    unknown = []
    for first, second in NAMED.findall(text):
        command = commands.get(first)
        if command is None:
            unknown.append(first)
            continue
        nested = subcommands(command)
        if nested and second not in nested:
            unknown.append(f"{first} {second}")
    return unknown


def test_every_atelier_command_the_docs_name_exists() -> None:
    unknown = {
        str(path.relative_to(ROOT)): unknown_commands(path.read_text())
        for path in NAMING
        if unknown_commands(path.read_text())
    }
    assert unknown == {}


def test_a_command_that_does_not_exist_is_caught() -> None:
    assert unknown_commands("run `atelier apns doctor` or `atelier push nothing`") == [
        "apns",
        "push nothing",
    ]
    assert unknown_commands("`atelier push doctor --offline`, `atelier dev`") == []
