"""Malformed and hostile specs: exit 2, one short line per problem, never a crash or a hang.

A seeded generator mutates the project's own specs (``specs/``, ``tests/bad_specs/``)
and adds the hostile classes of issue 18 (reference chains and cycles, deep nesting,
huge strings, wrong types, numbers out of range, syntax errors); each spec goes through
``schedtrain check`` in process (``cli.main``, the command's own code), a handful through
the real command.
"""

from __future__ import annotations

import contextlib
import copy
import io
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from schedtrain import SpecError
from schedtrain.cli import main
from schedtrain.errors import (
    MESSAGE_LIMIT,
    PATH_LIMIT,
    SHOWN_PROBLEMS,
    Problem,
    describe,
    one_line,
    shorten,
)
from schedtrain.spec import loads_spec
from schedtrain.spec.references import MAX_TABLES, MAX_TOTAL_TABLES
from schedtrain.spec.write import toml_value
from schedtrain.triggers import MAX_DEPTH

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*ROOT.glob("specs/*.toml"), *ROOT.glob("tests/bad_specs/*.toml")])
#: Python's words for its own failures: a user never reads them.
INTERNALS = re.compile(r"Traceback|NoneType|<class|RecursionError|object at 0x|TypeError|"
                       r"KeyError|AttributeError|IndexError|maximum recursion")
HUGE = "x" * 100_000


def _check(path: Path) -> tuple[int, list[str]]:
    """``schedtrain check PATH`` in process: the exit code and the stderr lines."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["check", str(path)])
    return code, err.getvalue().splitlines()


def _assert_refused_well(path: Path, code: int, lines: list[str]) -> None:
    """Exit 2; each problem one line naming the file, short, in the user's words."""
    assert code == 2, lines
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors, lines
    assert len(errors) <= SHOWN_PROBLEMS + 1
    assert lines[-1].startswith(f"{path}: ") and lines[-1].endswith(("problem", "problems"))
    for line in lines:
        assert len(line) <= len(str(path)) + PATH_LIMIT + MESSAGE_LIMIT + 40, line[:300]
        assert not INTERNALS.search(line), line[:300]
    for line in errors:
        assert line.startswith(f"error: {path}: "), line[:300]


def _chain(n: int, body: str = 'any = ["t{next}"]') -> str:
    tables = "".join(f"[triggers.t{i}]\n{body.format(next=i + 1)}\n" for i in range(n))
    return tables + f'[triggers.t{n}]\nevery = "1 epoch"\n[callbacks.a]\ntrigger = "t0"\n'


def _nested(levels: int, key: str = "any") -> str:
    inner = '{ on = "train_end" }'
    for _ in range(levels):
        inner = f"{{ {key} = [{inner}] }}" if key != "not" else f"{{ not = {inner} }}"
    return inner


def _callbacks(n: int, trigger: str) -> str:
    return "".join(f'[callbacks.c{i}]\ntype = "ModelSaver"\ntrigger = {trigger}\n'
                   for i in range(n))


#: One spec of each hostile class of issue 18, each malformed.
HOSTILE: dict[str, str] = {
    "chain_64": _chain(64),
    "chain_500_not": _chain(500, 'not = "t{next}"'),
    "chain_5000": _chain(5000, 'all = ["t{next}", {{ on = "train_end" }}]'),
    "cycle_2": '[triggers.a]\nany = ["b"]\n[triggers.b]\nall = ["a"]\n[callbacks.x]\n'
               'trigger = "a"\n',
    "cycle_5000": _chain(5000).replace('[triggers.t5000]\nevery = "1 epoch"',
                                       '[triggers.t5000]\nany = ["t0"]'),
    "doubling_64": "".join(f'[triggers.t{i}]\nany = ["t{i + 1}", {{ all = ["t{i + 1}", '
                           f'{{ every = "{i + 2} steps" }}] }}]\n' for i in range(64))
                   + '[triggers.t64]\nevery = "1 epoch"\n[callbacks.a]\ntrigger = "t0"\n',
    "any_99_beside_5000": _callbacks(5000, '{ every = "1 step" }')
                          + f"[callbacks.deep]\ntrigger = {_nested(99)}\n",
    "not_70": f"[callbacks.a]\ntrigger = {_nested(70, 'not')}\n",
    "args_list_70": '[callbacks.a]\ntype = "ScheduledHyperParamSetter"\nparam = "lr"\n'
                    f'schedule = {"[" * 70}1{"]" * 70}\ntrigger = {{ every = "1 epoch" }}\n',
    "args_table_70": '[callbacks.a]\ntype = "LRScheduler"\nscheduler = "StepLR"\n'
                     f'args = {"{ x = " * 70}1{" }" * 70}\ntrigger = {{ every = "1 epoch" }}\n',
    "nesting_5000": f"[callbacks.a]\ntrigger = {_nested(5000)}\n",
    "huge_key": f'[callbacks.a]\ntype = "ModelSaver"\n{HUGE} = 1\n'
                'trigger = { every = "1 step" }\n',
    "huge_value": f'[callbacks.a]\ntype = "ModelSaver"\nkeep = "{HUGE}"\n'
                  f'trigger = {{ every = "{HUGE}" }}\n',
    "huge_name": f'[callbacks.{HUGE}]\ntrigger = {{ every = "1 step" }}\n',
    "huge_reference": f'[callbacks.a]\ntrigger = "{HUGE}"\n',
    "huge_type": f'[callbacks.a]\ntype = "{HUGE}"\ntrigger = {{ every = "1 step" }}\n',
    "huge_spaced": f'[callbacks.a]\ntrigger = {{ every = "{"1 " * 50_000}" }}\n',
    "huge_syntax_line": f'[callbacks.a]\ntrigger = {{ every = "1 step" }} {HUGE}\n',
    "empty_inferencer": '[callbacks.a]\ntype = "InferenceRunner"\ninferencers = [{}]\n'
                        'trigger = { every = "1 epoch" }\n',
    "every_5steps": '[callbacks.a]\ntrigger = { every = "5steps" }\n',
    "nul_in_string": '[callbacks.a]\ntrigger = { every = "5 steps\\u0000" }\n',
    "nul_in_text": '[callbacks.a]\ntrigger = { every = "5 steps" }\n\x00\n',
    "unicode_digits": '[callbacks.a]\ntrigger = { every = "\uff15 steps" }\n',
    "inf_period": '[callbacks.a]\ntrigger = { every = "1e400 steps" }\n',
    "numbers_out_of_range": "[clock]\nseconds_per_step = 1e400\nepochs = 18446744073709551616\n"
                            '[callbacks.a]\ntype = "ModelSaver"\nkeep = -0\n'
                            'trigger = { every = "1180591620717411303424 steps" }\n',
    "top_level_not_tables": 'callbacks = [1, 2]\ntriggers = "x"\nclock = 5\nrun = []\n'
                            "events = { a = 1 }\n",
    "wrong_types": "[clock]\nepochs = { a = 1 }\n[callbacks.a]\ntype = [\"a\"]\n"
                   "trigger = { every = { a = 1 }, at = [[1]], on = 5, if = [] }\n",
    "date_value": "[callbacks.a]\ntrigger = { every = 1979-05-27T07:32:00Z }\n",
    "many_problems": _callbacks(3000, '{ every = "1 stpe" }'),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_spec_is_refused_on_short_lines(tmp_path: Path, name: str) -> None:
    """Each hostile class: exit 2, at most 20 problems shown, short lines, no internals."""
    path = tmp_path / f"{name}.toml"
    path.write_text(HOSTILE[name], encoding="utf-8")
    code, lines = _check(path)
    _assert_refused_well(path, code, lines)


# -- the seeded generator ----------------------------------------------------------------

_VALUES: list[Any] = [
    HUGE, "5steps", "", " ", "\x00", "\uff15 steps", "1e400 steps", "-1 steps", "0 steps",
    "1 step", "train_end", "t0", "x" * 300, {}, [], [{}], [[]], {"": 1}, {"type": {}},
    {"any": []}, {"not": {}}, {"every": {}}, 2**70, -(2**70), -1, 0, 1, float("inf"),
    float("nan"), -0.0, 1e308, True, False, [1] * 3, ["a", 1, {}],
    {"any": [{"on": "train_end"}, "missing"]}, {"custom": "os:system"},
]  # fmt: skip


def _alternate(inner: Any, level: int, rng: random.Random) -> dict[str, Any]:
    """One level of ``any``/``all`` alternating, with a clock leaf beside (issue 34: the
    static checks were exponential in such depth)."""
    leaf = {"every": f"{rng.randint(1, 9)} steps", "start": f"{rng.randint(0, 60)} steps"}
    return {("any", "all")[level % 2]: [inner, leaf]}


def _hostile_value(rng: random.Random) -> Any:
    pick = rng.random()
    if pick < 0.15:
        depth = rng.choice([MAX_DEPTH - 1, MAX_DEPTH + 1, 90])
        value: Any = {"on": "train_end"}
        key = rng.choice(["any", "all", "not", "list", "table", "alternating"])
        for level in range(depth):
            value = ({"not": value} if key == "not" else [value] if key == "list"
                     else {"x": value} if key == "table"
                     else _alternate(value, level, rng) if key == "alternating"
                     else {key: [value]})
        return value
    return copy.deepcopy(rng.choice(_VALUES))  # never share one value between specs


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    items = data.items() if isinstance(data, dict) else enumerate(data) \
        if isinstance(data, list) else ()
    for key, value in items:
        yield from _paths(value, (*prefix, key))


def _replace(data: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def _write(data: dict[str, Any]) -> str:
    # The writer recurses per level; the deep values go past what pytest's stack leaves.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5_000))
    try:
        return "".join(f"{toml_value({k: v})[2:-2]}\n" for k, v in data.items())
    finally:
        sys.setrecursionlimit(limit)


def _text_mutation(text: str, rng: random.Random) -> str:
    i = rng.randrange(len(text) + 1)
    kind = rng.randrange(4)
    if kind == 0:
        return text[:i] + text[i + 1:]
    if kind == 1:
        return text[:i] + rng.choice("[]{}=\"'\n#\\,.\x00\u00e9") + text[i:]
    if kind == 2:
        lines = text.splitlines(keepends=True) or [""]
        j = rng.randrange(len(lines))
        return "".join([*lines[:j + 1], *lines[j:]])
    return text[:i]


def _mutants(seed: int, count: int) -> Iterator[str]:
    rng = random.Random(seed)
    sources = [p.read_text(encoding="utf-8") for p in SOURCES]
    for _ in range(count):
        text = rng.choice(sources)
        if rng.random() < 0.3:
            yield _text_mutation(text, rng)
            continue
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            yield _text_mutation(text, rng)
            continue
        paths = list(_paths(data))[1:] or [("callbacks",)]  # the original's, not the deep values'
        for path in rng.sample(paths, min(len(paths), rng.randint(1, 3))):
            if rng.random() < 0.15 and isinstance(path[-1], str):  # a hostile key
                parent = data
                with contextlib.suppress(LookupError, TypeError):
                    for key in path[:-1]:
                        parent = parent[key]
                if isinstance(parent, dict) and path[-1] in parent:
                    parent[rng.choice([HUGE, "evry", "", "type", "trigger"])] = parent.pop(
                        path[-1])
                continue
            with contextlib.suppress(LookupError, TypeError):  # an earlier change removed it
                _replace(data, path, _hostile_value(rng))
        yield _write(data)


def test_mutated_specs_end_in_ok_or_short_refusals(tmp_path: Path) -> None:
    """2,500 seeded mutations of the project's specs: each is accepted (exit 0) or refused
    with exit 2 and one short line per problem; nothing raises, nothing hangs."""
    path = tmp_path / "m.toml"
    refused = 0
    for text in _mutants(seed=18, count=2_500):
        path.write_text(text, encoding="utf-8")
        code, lines = _check(path)
        if code == 0:
            assert not [line for line in lines if line.startswith("error")], lines
            continue
        refused += 1
        _assert_refused_well(path, code, lines)
    assert refused > 2_000  # the generator makes mostly malformed specs


# -- the rules behind it -----------------------------------------------------------------


class TestNamedTriggerLimits:
    """References are followed with their depth and size known first."""

    def test_a_chain_within_the_depth_is_accepted(self) -> None:
        """63 names each referring to the next nest 64 levels: allowed."""
        spec = loads_spec(_chain(63))
        assert set(spec.triggers) == {f"t{i}" for i in range(64)}

    def test_a_chain_past_the_depth_is_one_problem_where_it_crosses(self) -> None:
        """5,000 names in a chain: one problem, at the reference that crosses 64 levels."""
        with pytest.raises(SpecError) as info:
            loads_spec(_chain(5000))
        (problem,) = info.value.problems
        assert problem.path == "triggers.t4936.any[0]"
        assert "65 levels deep" in problem.message

    def test_a_reference_counts_as_the_table_it_names(self) -> None:
        """A 60-level inline nesting around a 10-level name is 70 levels: refused there."""
        deep = "{ any = [" * 60 + '"t0"' + "] }" * 60
        text = _chain(9) + f"[callbacks.b]\ntrigger = {deep}\n"
        with pytest.raises(SpecError) as info:
            loads_spec(text)
        (problem,) = info.value.problems
        assert problem.path == "callbacks.b.trigger" + ".any[0]" * 60
        assert problem.found == "70 levels"

    def test_a_long_cycle_is_reported_once_and_short(self) -> None:
        """A cycle through 5,001 names: one problem, the chain shortened."""
        with pytest.raises(SpecError) as info:
            loads_spec(HOSTILE["cycle_5000"])
        (problem,) = info.value.problems
        assert problem.path == "triggers.t5000.any[0]"
        assert "t0 -> t1 -> t2 -> ... -> t4999 -> t5000 -> t0 (5001 names)" in problem.message

    def test_a_name_used_twice_per_level_is_refused_by_size(self) -> None:
        """Doubling at each level would write out 2**64 tables: refused past MAX_TABLES."""
        with pytest.raises(SpecError) as info:
            loads_spec(HOSTILE["doubling_64"])
        (problem,) = info.value.problems
        assert problem.path.startswith("triggers.t")
        assert f"more than {MAX_TABLES:,} tables" in problem.message

    def test_all_callbacks_together_are_bounded(self) -> None:
        """Many callbacks using one large named trigger: refused past MAX_TOTAL_TABLES."""
        named = '[triggers.big]\nany = [' + ", ".join(
            f'{{ every = "{i + 1} steps" }}' for i in range(500)) + "]\n"
        n = MAX_TOTAL_TABLES // 501 + 1
        with pytest.raises(SpecError) as info:
            loads_spec(named + _callbacks(n, '"big"'))
        (problem,) = info.value.problems
        assert problem.path == f"callbacks.c{n - 1}.trigger"
        assert f"{MAX_TOTAL_TABLES:,} tables in all" in problem.message


class TestMessages:
    """What a problem's line says, and how long it is."""

    @given(words=st.lists(st.text(alphabet="abc/_-.", min_size=1, max_size=300), max_size=12),
           quoted=st.text(alphabet="xyz", min_size=81, max_size=2000))
    def test_a_line_keeps_folders_whole_and_cuts_quoted_values(self, words: list[str],
                                                               quoted: str) -> None:
        """One line of at most about MESSAGE_LIMIT characters; a quoted value over 80
        characters is always cut with its length; unquoted words (folders a lookup names)
        stay whole while the line fits."""
        text = " ".join(words)
        line = one_line(f"found {quoted!r} in\n{text}")
        assert "\n" not in line and len(line) <= MESSAGE_LIMIT
        assert f"({len(quoted) + 2:,} characters)" in line
        if len(f"found {shorten(repr(quoted))} in {text}") <= MESSAGE_LIMIT:
            assert line.endswith(f" in {text}")

    def test_describe_never_shows_python(self) -> None:
        """A missing value is 'nothing'; a long string is cut with its length."""
        assert describe(None) == "nothing"
        assert describe(HUGE).endswith("(100,002 characters)")
        assert len(describe(HUGE)) < 100

    def test_a_long_problem_is_one_short_line_with_the_file_whole(self) -> None:
        """Path and message are cut in the middle; the file name is kept whole."""
        problem = Problem("callbacks.a" + ".any[0]" * 100, "bad\nvalue " + HUGE, "f.toml")
        line = str(problem)
        assert "\n" not in line
        assert line.startswith("f.toml: callbacks.a.any[0]")
        assert len(line) <= len("f.toml: ") + PATH_LIMIT + MESSAGE_LIMIT + 40

    def test_the_error_text_lists_twenty_problems(self) -> None:
        """``str(SpecError)`` of 3,000 problems: the count, 20 of them, how many more."""
        with pytest.raises(SpecError) as info:
            loads_spec(HOSTILE["many_problems"])
        lines = str(info.value).splitlines()
        assert len(info.value.problems) == 3000
        assert lines[0] == "3000 problems:"
        assert lines[-1] == f"  ... and {3000 - SHOWN_PROBLEMS} more"
        assert len(lines) == SHOWN_PROBLEMS + 2

    def test_the_command_shows_twenty_problems_and_counts_the_rest(self, tmp_path: Path) -> None:
        """3,000 bad callbacks: 20 error lines, '... and N more', the total."""
        path = tmp_path / "many.toml"
        path.write_text(HOSTILE["many_problems"], encoding="utf-8")
        code, lines = _check(path)
        assert code == 2
        assert lines[SHOWN_PROBLEMS] == (f"error: {path}: ... and {3000 - SHOWN_PROBLEMS} more "
                                         "problems")
        assert lines[-1] == f"{path}: 3000 problems"

    @pytest.mark.parametrize(("name", "path", "fragment"), [
        ("every_5steps", "callbacks.a.trigger.every", "'5 steps'"),
        ("empty_inferencer", "callbacks.a.inferencers[0].type", "missing key 'type'"),
        ("args_list_70", "callbacks.a.schedule", f"more than {MAX_DEPTH} levels"),
        ("args_table_70", "callbacks.a.args", f"more than {MAX_DEPTH} levels"),
        ("top_level_not_tables", "clock", "expected a table, found integer 5"),
        ("huge_name", "callbacks." + HUGE, "at most 100 characters"),
        ("date_value", "callbacks.a.trigger.every", "found date-time 1979-05-27"),
    ])  # fmt: skip
    def test_problem_names_its_key_path(self, name: str, path: str, fragment: str) -> None:
        """Each hostile class is refused at its key path, saying what was expected."""
        with pytest.raises(SpecError) as info:
            loads_spec(HOSTILE[name])
        assert any(p.path == path and fragment in p.message for p in info.value.problems), [
            str(p) for p in info.value.problems]


@pytest.mark.parametrize("command", ["plan", "train"])
def test_plan_and_train_refuse_before_building(tmp_path: Path, command: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``plan`` and ``train`` refuse a hostile spec with exit 2 and write nothing."""
    monkeypatch.chdir(tmp_path)
    for name in ("chain_5000", "doubling_64", "huge_value", "many_problems"):
        path = tmp_path / f"{name}.toml"
        path.write_text("[run]\ntask = \"m:f\"\nmax_steps = 1\n" + HOSTILE[name]
                        if name != "many_problems" else HOSTILE[name], encoding="utf-8")
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main([command, str(path)])
        assert code == 2, err.getvalue()
        assert len(err.getvalue().splitlines()) <= SHOWN_PROBLEMS + 1
        assert not INTERNALS.search(err.getvalue())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{n}.toml" for n in ("chain_5000", "doubling_64", "huge_value", "many_problems"))


@pytest.mark.parametrize("name", ["chain_5000", "cycle_5000", "doubling_64", "nesting_5000"])
def test_the_real_command_refuses(tmp_path: Path, name: str) -> None:
    """Through ``python -m schedtrain check``: exit 2, short lines, no traceback."""
    path = tmp_path / f"{name}.toml"
    path.write_text(HOSTILE[name], encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "schedtrain", "check", str(path)],
                            capture_output=True, text=True, check=False, timeout=60)
    _assert_refused_well(path, result.returncode, result.stderr.splitlines())


@st.composite
def _reference_dags(draw: st.DrawFn) -> tuple[list[int], list[list[int]]]:
    """Named triggers t0..tn-1: t_i wraps its `any` in ``wraps[i]`` `all` tables and
    refers to later names (some several times)."""
    n = draw(st.integers(2, 7))
    wraps = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    refs = [draw(st.lists(st.integers(i + 1, n - 1), max_size=6)) if i < n - 1 else []
            for i in range(n)]
    return wraps, refs


def _dag_text(wraps: list[int], refs: list[list[int]]) -> str:
    out = []
    for i, (w, used) in enumerate(zip(wraps, refs, strict=True)):
        items = ", ".join([*(f'"t{j}"' for j in used), '{ on = "train_end" }'])
        inner = f"{{ any = [{items}] }}"
        for _ in range(w):
            inner = f"{{ all = [{inner}] }}"
        out.append(f"[triggers.t{i}]\n{inner[2:-2]}\n")  # the outermost table's keys
    return "".join(out) + '[callbacks.a]\ntrigger = "t0"\n'


@given(_reference_dags())
@example(([31, 30], [[1], []]))  # exactly MAX_DEPTH levels: accepted
@example(([32, 30], [[1], []]))  # one more: refused
@example(([0, 0, 0, 0, 0], [[1] * 6, [2] * 6, [3] * 6, [4] * 6, []]))  # 2 + 6 * (...): 2,590
def test_reference_limits_follow_their_definition(dag: tuple[list[int], list[list[int]]]) -> None:
    """A spec of named triggers loads exactly when every name, written out, nests at most
    MAX_DEPTH tables and has at most MAX_TABLES, computed here by the definition."""
    wraps, refs = dag
    depth: dict[int, int] = {}
    tables: dict[int, int] = {}
    for i in reversed(range(len(wraps))):
        # t_i's own tables: `wraps[i]` all-tables, the any-table, the on-table under it;
        # a name in the any list sits where the on-table does.
        own = wraps[i] + 2
        depth[i] = max([own, *(own - 1 + depth[j] for j in refs[i])])
        tables[i] = own + sum(tables[j] for j in refs[i])
    fits = all(depth[i] <= MAX_DEPTH and tables[i] <= MAX_TABLES for i in depth)
    try:
        loads_spec(_dag_text(wraps, refs))
    except SpecError as exc:
        assert not fits, [str(p) for p in exc.problems]
        assert all(("levels" in p.message or "tables" in p.message) for p in exc.problems)
    else:
        assert fits
