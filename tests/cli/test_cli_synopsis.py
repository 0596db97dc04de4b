"""docs/cli.md's synopsis says what ``--help`` says: every command, every option, every
choice; a section heading names only options that exist."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from schedtrain.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "cli.md").read_text()


def _synopsis() -> list[str]:
    """The lines of the page's first code block (its synopsis)."""
    block = re.search(r"^```\n(.*?)^```", PAGE, re.S | re.M)
    assert block, "docs/cli.md starts with a synopsis block"
    return [line.split("  #")[0].strip() for line in block[1].splitlines() if line.strip()]


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(parser: argparse.ArgumentParser) -> dict[str, list[str] | None]:
    """Each option's first long (or only) spelling and its choices."""
    out: dict[str, list[str] | None] = {}
    for action in parser._actions:
        names = [s for s in action.option_strings if s not in ("-h", "--help")]
        if names:
            out[min(names, key=lambda s: (not s.startswith("--"), s))] = (
                [str(c) for c in action.choices] if action.choices else None)
    return out


def _documented(line: str) -> dict[str, list[str] | None]:
    """The options of a synopsis line, with the values it spells ``a|b|c`` (choices, or
    a metavar such as ``PATH|auto``)."""
    out: dict[str, list[str] | None] = {}
    for name, value in re.findall(r"\[(-[-\w]+)(?: ([^\]]+))?\]", line):
        out[name] = value.split("|") if value and "|" in value else None
    return out


@pytest.mark.parametrize("command", sorted(_commands()))
def test_each_command_has_its_whole_synopsis(command: str) -> None:
    """One synopsis line per command, with exactly the options ``--help`` lists (and
    their choices); the positional arguments in the order ``--help`` shows them."""
    lines = [ln for ln in _synopsis() if ln.startswith(f"schedtrain {command} ")]
    assert len(lines) == 1, f"docs/cli.md: no single synopsis line for {command!r}: {lines}"
    parser = _commands()[command]
    documented, real = _documented(lines[0]), _options(parser)
    for name, choices in real.items():
        if choices and name in documented:
            assert documented[name] == choices, f"{lines[0]}: {name} takes {choices}"
    assert set(documented) == set(real), (
        f"docs/cli.md, `{command}` synopsis: missing {sorted(set(real) - set(documented))}, "
        f"unknown {sorted(set(documented) - set(real))}")
    positionals = [a.metavar or a.dest for a in parser._actions if not a.option_strings]
    words = lines[0].split()
    assert [w.rstrip(".") for w in words if w.rstrip(".") in positionals] == positionals


def test_the_top_level_synopsis() -> None:
    """The first line: the options before the command."""
    line = _synopsis()[0]
    assert line.startswith("schedtrain [") and "COMMAND" in line
    real = _options(build_parser())
    documented = {re.sub(r"\[|\]", "", w) for w in line.split() if w.startswith("[-")}
    spellings = {s for a in build_parser()._actions for s in a.option_strings} - {"-h", "--help"}
    assert documented <= spellings and len(documented) == len(real)


def test_headings_name_real_options() -> None:
    """A section heading ``## `schedtrain CMD ...` `` names only options CMD has."""
    commands = _commands()
    headings = re.findall(r"^## `schedtrain (\w+)([^`]*)`", PAGE, re.M)
    assert {c for c, _ in headings} == set(commands)
    for command, rest in headings:
        named = set(re.findall(r"\[(--[-\w]+)", rest))
        assert named <= set(_options(commands[command])), (command, named)
