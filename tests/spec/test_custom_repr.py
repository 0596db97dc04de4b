"""E13: a custom trigger is shown by its own ``__repr__`` when its class has one, else by
the spec's spelling (``{ custom = "mod:Class", args = {...} }``): never by an object's
address, which differs at each run."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from schedtrain.cli.main import main
from schedtrain.spec import load_spec

MODULE = '''
import attrs
from schedtrain.triggers import Trigger


@attrs.frozen(repr=False)
class NaiveOdd(Trigger):
    def evaluate(self, pt):
        return pt.event == "step_end" and pt.now.step % 2 == 1


class EveryNth(Trigger):
    def __init__(self, n, label="x"):
        self.n = n

    def evaluate(self, pt):
        return pt.event == "step_end" and pt.now.step % self.n == 0


class Named(EveryNth):
    def __repr__(self):
        return f"Named({self.n})"
'''
SPEC = """
[clock]
epochs = 1
steps_per_epoch = 10

[callbacks.odd]
trigger = { custom = "mytrig44:NaiveOdd" }

[callbacks.third]
trigger = { all = [
    { custom = "mytrig44:EveryNth", args = { n = 3, label = "a b" } }, { every = "1 step" }] }

[callbacks.named]
trigger = { custom = "mytrig44:Named", args = { n = 5 } }
"""
SHOWN = {
    "odd": '{ custom = "mytrig44:NaiveOdd" }',
    "third": '{ custom = "mytrig44:EveryNth", args = { n = 3, label = "a b" } } & '
             "every('1 step')",
    "named": "Named(5)",
}


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "mytrig44.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "spec.toml"
    path.write_text(textwrap.dedent(SPEC))
    return path


@pytest.mark.parametrize("imports", [True, False])
def test_repr_is_its_own_or_the_specs_spelling(spec: Path, imports: bool) -> None:
    """Loaded or not: the class's own repr if it has one (loaded), else the TOML spelling."""
    loaded = load_spec(spec, imports=imports)
    for name, shown in SHOWN.items():
        expected = shown if imports or name != "named" else \
            '{ custom = "mytrig44:Named", args = { n = 5 } }'
        assert repr(loaded.callbacks[name].trigger) == expected


def test_plan_shows_no_address_and_the_same_text_each_time(
        spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``plan --import`` twice (new instances each time) prints the same table, which
    names each custom trigger as above."""
    outs = []
    for _ in range(2):
        assert main(["plan", str(spec), "--import"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
    assert " at 0x" not in outs[0]
    rows = {line.split()[0]: line for line in outs[0].splitlines()[2:5]}
    for name, shown in SHOWN.items():
        assert f"{name}  " in rows[name] and shown in rows[name], rows[name]
