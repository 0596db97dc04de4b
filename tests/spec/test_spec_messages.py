"""Every message a spec or a command-line value gets: one line of at most 300 characters,
a huge number named by its digit count, exit 2 — never Python's words or a traceback.

Hypothesis writes specs with hostile values where counts, times, names and types go:
numbers of thousands of digits (bare, in a time string, as a decimal, past a float's
range), keys and names thousands of characters long, control characters and escape
sequences; each goes through ``schedtrain check`` and ``plan`` in process. The command
line's own numbers (``--epochs``, ``--checkpoint-seconds``, ``--checkpoint-size``, ...)
get the same.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedtrain.cli import main
from schedtrain.errors import MESSAGE_LIMIT

#: Python's words for its own failures, and its limit on converting long integers.
INTERNALS = re.compile(r"Traceback|Exceeds the limit|set_int_max_str_digits|NoneType|<class|"
                       r"RecursionError|object at 0x|TypeError|KeyError|AttributeError|"
                       r"IndexError|OverflowError|maximum recursion")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
VALID = '[callbacks.ok]\ntrigger = { every = "1 epoch" }\n'
_VALID = VALID.replace("{", "{{").replace("}", "}}")  # within a place's format string


def _run(argv: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue().splitlines()


def _assert_short_lines(lines: list[str]) -> None:
    for line in lines:
        assert len(line) <= MESSAGE_LIMIT, (len(line), line[:400])
        assert not INTERNALS.search(line), line[:400]
        assert not CONTROL.search(line), line[:400]


def _assert_refused_in_short_lines(code: int, lines: list[str]) -> None:
    assert code == 2, lines
    assert any(line.startswith(("error: ", "schedtrain ")) for line in lines), lines
    _assert_short_lines(lines)


def _q(text: str) -> str:
    """``text`` as a TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text)


_digits = st.integers(20, 6_000).map(lambda n: "9" * n)
#: A number far past anything schedtrain counts, in each way TOML and a time can hold it.
_huge_numbers = st.one_of(
    _digits,
    _digits.map(lambda d: f"-{d}"),
    _digits.map(lambda d: f"{d}.5"),
    st.sampled_from(["1e5000", "-1e5000", "inf", "nan"]),
    st.tuples(_digits, st.sampled_from(["steps", "epochs", "seconds", "min", "M tokens"])
              ).map(lambda t: _q(f"{t[0]} {t[1]}")),
    _digits.map(lambda d: _q(f"0.{d} seconds")),
    _digits.map(lambda d: _q(f"1_{d} steps")),
    st.sampled_from([_q("1e5000 steps"), _q("1e400 seconds")]),
)
#: Where a count or a time goes, as TOML with ``{}`` for the value.
_NUMBER_PLACES = [
    "[callbacks.a]\ntrigger = {{ every = {} }}\n",
    '[callbacks.a]\ntrigger = {{ every = "1 epoch", start = {} }}\n',
    '[callbacks.a]\ntrigger = {{ every = "1 epoch", stop = {} }}\n',
    "[callbacks.a]\ntrigger = {{ at = [{}] }}\n",
    '[callbacks.a]\ntrigger = {{ plateau = "train/loss", patience = {} }}\n',
    '[callbacks.a]\ntype = "EarlyStopping"\nmonitor = "train/loss"\npatience = {}\n'
    'trigger = {{ every = "1 epoch" }}\n',
    '[callbacks.a]\ntype = "ModelSaver"\nkeep = {}\ntrigger = {{ every = "1 epoch" }}\n',
    "[clock]\nepochs = {}\n" + _VALID,
    "[clock]\nepochs = 2\nsteps_per_epoch = {}\n" + _VALID,
    '[run]\ntask = "m:f"\nmax_steps = {}\n' + _VALID,
    '[run]\ntask = "m:f"\nmax_epochs = {}\n' + _VALID,
]
_long = st.integers(150, 5_000)
#: Text a user might paste: long, with line breaks, escape sequences, odd characters.
_hostile_text = st.one_of(
    _long.map(lambda n: "k" * n),
    st.text(st.characters(codec="utf-8", categories=["Cc", "Ll", "Zs", "Po"]), min_size=1,
            max_size=400).filter(lambda s: CONTROL.search(s) is not None),
    st.sampled_from(["\x1b[31mred\x1b[0m", "a\nerror: forged", "a\rb", "tab\there"]),
    _long.map(lambda n: "\x1b[2J" + "y" * n + "\nerror: forged"),
)
#: Where a name goes (each refused whatever the name), with ``{}`` for it as a TOML string.
_NAME_PLACES = [
    "[callbacks.a]\ntrigger = {{ every = \"1 epoch\" }}\n{} = 1\n",  # unknown key
    "[callbacks.a]\ntrigger = {{ every = \"1 epoch\", {} = 1 }}\n",  # unknown trigger key
    "[clock]\n{} = 1\n" + _VALID,
    "{} = 1\n" + _VALID,  # unknown table
    "[callbacks.a]\ntype = {}\ntrigger = {{ every = \"1 epoch\" }}\n",  # unknown type
    "[callbacks.a]\ntrigger = {}\n",  # a missing named trigger
    "[callbacks.a]\ntrigger = {{ on = {} }}\n",  # an unknown event
    "[callbacks.a]\ntrigger = {{ every = {} }}\n",  # not a time
    "[callbacks.a]\ntrigger = {{ plateau = {} }}\n",  # no patience
    '[callbacks.a]\ntype = "EarlyStopping"\nmonitor = "train/loss"\npatience = 2\nmode = {}\n'
    'trigger = {{ every = "1 epoch" }}\n',  # not one of the choices
]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(place=st.sampled_from(_NUMBER_PLACES), number=_huge_numbers, command=st.sampled_from(
    ["check", "plan"]))
def test_a_huge_number_anywhere_is_named_by_its_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, place: str, number: str,
        command: str) -> None:
    """A number of thousands of digits (or past a float's range) where a count or a time
    goes: each line short, no Python wording. A time past 2**63 - 1 in its counter (a
    fraction of a second rounds to nanoseconds), or a
    number too long for Python to read, is refused (exit 2), the long one by its digits;
    a bare integer Python reads is judged by the key's own range (``patience`` has none)."""
    monkeypatch.chdir(tmp_path)
    Path("m.toml").write_text(place.format(number), encoding="utf-8")
    code, lines = _run([command, "m.toml"])
    _assert_short_lines(lines)
    if len(number) > 4_300 or (number.startswith('"') and not number.startswith('"0.')):
        _assert_refused_in_short_lines(code, lines)
    else:
        assert code in (0, 2), lines
    if len(number) > 4_300 and number.lstrip("-").isdigit():  # a float reads as inf
        assert re.search(r"[0-9,]+ digits", "\n".join(lines)), lines


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(places=st.lists(st.sampled_from(_NAME_PLACES), min_size=1, max_size=3),
       text=_hostile_text)
def test_long_names_and_control_characters_give_short_clean_lines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, places: list[str],
        text: str) -> None:
    """A long or control-character name, key or value in any place: exit 2, each line at
    most 300 characters, no line break or escape sequence reaches the terminal."""
    monkeypatch.chdir(tmp_path)
    spec = "".join(p.format(_q(text)).replace("[callbacks.a]", f"[callbacks.a{i}]")
                   for i, p in enumerate(places))
    Path("m.toml").write_text(spec, encoding="utf-8")
    code, lines = _run(["check", "m.toml"])
    _assert_refused_in_short_lines(code, lines)


_many_digits = st.integers(101, 6_000).map(lambda n: "9" * n)  # too many for any option
_FLAGS = [["plan", "ok.toml", "--epochs"], ["plan", "ok.toml", "--steps-per-epoch"],
          ["plan", "ok.toml", "--first"], ["plan", "ok.toml", "--checkpoint-seconds"],
          ["plan", "ok.toml", "--checkpoint-size"], ["plan", "ok.toml", "--warn-share"],
          ["plan", "ok.toml", "--format"], ["diff", "ok.toml", "ok.toml", "--from"],
          ["retime", "run", "ok.toml", "--wait"]]


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(_FLAGS), value=st.one_of(
    _many_digits, _many_digits.map(lambda d: f"{d}GB"), _many_digits.map(lambda d: f"-{d}"),
    st.sampled_from(["1e5000", "1e400GB", "inf", "nan"]),
    _long.map(lambda n: "z" * n)))
def test_a_huge_command_line_value_is_one_short_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: list[str], value: str) -> None:
    """Every number the command line reads: a bad one is exit 2 in one short line naming
    the option; a huge one by its digit count, never Python's limit."""
    monkeypatch.chdir(tmp_path)
    Path("ok.toml").write_text("[clock]\nepochs = 2\nsteps_per_epoch = 3\n" + VALID,
                               encoding="utf-8")
    code, lines = _run([*flag, value])
    _assert_refused_in_short_lines(code, lines)
    assert any(flag[-1] in line for line in lines), lines
    if len(value) > 4_300 and value.strip("-GB").isdigit() and flag[-1] != "--format":
        assert any("digits" in line for line in lines), lines
