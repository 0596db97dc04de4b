"""Bad input gets a clear error with its key path, never a crash, never executed code."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain import SpecError, Time
from schedtrain.cli import main
from schedtrain.errors import ArgumentError
from schedtrain.spec import loads_spec
from schedtrain.triggers import MAX_DEPTH, any_of, on


def _check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str],
           *args: str) -> tuple[int, str]:
    spec = tmp_path / "bad.toml"
    spec.write_text(textwrap.dedent(text))
    code = main(["check", str(spec), *args])
    return code, capsys.readouterr().err


def _nested(levels: int) -> str:
    return "{ any = [" * levels + '{ on = "train_end" }' + "] }" * levels


class TestRefusedByCheck:
    """``schedtrain check`` refuses each with exit 2, the key path, expected and found."""

    @pytest.mark.parametrize(("text", "path", "fragment"), [
        # trigger nesting past what the TOML reader follows (past MAX_DEPTH: test_spec_fuzz)
        (f"[callbacks.a]\ntrigger = {_nested(400)}\n", "callbacks.a.trigger",
         "nest too deeply"),
        ('events = "my_event"\n[callbacks.a]\ntrigger = { on = "my_event" }\n', "events",
         "expected a list, found string 'my_event'"),
        ('events = ["x", "x"]\n[callbacks.a]\ntrigger = { on = "x" }\n', "events[1]",
         "declared twice"),
        ('[callbacks.a]\ntype = "ModelSaver"\nkeep = "two"\ntrigger = { every = "1 epoch" }\n',
         "callbacks.a.keep", "expected a whole number >= 1 or a retention table such as "
         "{ latest = 3 }, found string 'two'"),
        ('[callbacks.a]\ntype = "ModelSaver"\nkeep = 0\ntrigger = { every = "1 epoch" }\n',
         "callbacks.a.keep", "expected a whole number >= 1 or a retention table such as "
         "{ latest = 3 }, found integer 0"),
        *[(f'[callbacks.a]\ntype = "{kind}"\nkeep = {keep}\ntrigger = {{ every = "1 epoch" }}\n',
           f"callbacks.a.keep{where}", "expected at most 2**63 - 1 checkpoints")
          for kind in ("ModelSaver", "MinSaver")
          for keep, where in ((2**63, ""), (f"{{ latest = {10**4000} }}", ".latest"),
                              (f"{{ any = [{{ every = '1 epoch' }}, {{ latest = {2**64} }}] }}",
                               ".any[1].latest"))],
        ('[callbacks.a]\ntrigger = { before_deadline = 10 }\n',
         "callbacks.a.trigger.before_deadline",
         "expected a duration such as '10 min' or '90 s', found integer 10"),
        ('[callbacks.a]\ntrigger = { before_deadline = "10 steps" }\n',
         "callbacks.a.trigger.before_deadline", "needs a duration such as '10 min'"),
        ('[callbacks.a]\ntype = "EarlyStopping"\nmode = "lowest"\n'
         'trigger = { every = "1 epoch" }\n', "callbacks.a.mode", "'min' or 'max'"),
        ('[callbacks.a]\ntype = "InferenceRunner"\ndata = "val.pt"\n'
         'trigger = { every = "1 epoch" }\n', "callbacks.a.data", "only from Python"),
        (f'[run]\nseed = {2**70}\n[callbacks.a]\ntrigger = {{ every = "1 step" }}\n',
         "run.seed", "expected a whole number from 0 to"),
        (f'[run]\ndevice = "cuda:{10**20}"\n[callbacks.a]\ntrigger = {{ every = "1 step" }}\n',
         "run.device", "N from 0 to 127"),
        ('[run]\ndevice = "cuda:1e20"\n[callbacks.a]\ntrigger = { every = "1 step" }\n',
         "run.device", "found string 'cuda:1e20'"),
        ('[callbacks.a]\ntrigger = { every = "1e30 tokens" }\n', "callbacks.a.trigger.every",
         "too large"),
        ('[callbacks.a]\ntrigger = { every = "100000000000 h" }\n', "callbacks.a.trigger.every",
         "too large"),
        ('[clock]\nepochs = 2\nepoch_lengths = [3]\n[callbacks.a]\n'
         'trigger = { every = "1 step" }\n', "clock.epochs", "epoch_lengths has 1 entries"),
        ('[callbacks.a]\ntrigger = { custom = "os:system", args = { command = "true" } }\n',
         "callbacks.a.trigger.custom", "not a trigger class"),
    ])  # fmt: skip
    def test_refused(self, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                     path: str, fragment: str) -> None:
        """Exit 2, and the message names the key path and what was wrong there."""
        code, err = _check(tmp_path, text, capsys, "--import")
        assert code == 2
        assert f"bad.toml: {path}: " in err
        assert fragment in err
        assert "Traceback" not in err

    def test_a_non_callback_type_is_never_called(self, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
        """``subprocess:Popen`` with arguments is refused before anything runs it."""
        marker = tmp_path / "ran"
        text = (f'[callbacks.a]\ntype = "subprocess:Popen"\nargs = ["touch", "{marker}"]\n'
                'trigger = { every = "1 epoch" }\n')
        code, err = _check(tmp_path, text, capsys, "--import")
        assert code == 2
        assert "callbacks.a.type: 'subprocess:Popen' is not a callback class" in err
        from schedtrain.training.from_spec import build_callbacks

        with pytest.raises(SpecError, match="is not a callback class"):
            build_callbacks(loads_spec(text))  # what `train` does
        assert not marker.exists()


class TestTime:
    """``Time`` refuses bad values with the argument and what was expected."""

    @pytest.mark.parametrize(("args", "error", "fragment"), [
        ((1, None), TypeError, "expected a unit such as 'steps'"),
        ((2**1100,), ArgumentError, "too large: at most 9223372036854775807 steps"),
        ((float("inf"), "s"), ArgumentError, "finite non-negative"),
        ((-1, "steps"), ArgumentError, "finite non-negative"),
        (("3", "steps"), ArgumentError, "must be a number"),
    ])
    def test_bad_values(self, args: tuple[object, ...], error: type[Exception],
                        fragment: str) -> None:
        """No raw TypeError or OverflowError from inside the library."""
        with pytest.raises(error, match=fragment.replace("(", r"\(")):
            Time(*args)  # type: ignore[arg-type]

    def test_a_huge_number_is_shown_short(self) -> None:
        """A value of hundreds of digits is not printed whole."""
        with pytest.raises(ArgumentError) as info:
            Time(2**1100)
        assert len(str(info.value)) < 120

    def test_composition_depth_is_bounded(self) -> None:
        """Triggers nested past MAX_DEPTH are refused when built, naming the depth."""
        t = on("train_end")
        with pytest.raises(ArgumentError, match=f"at most {MAX_DEPTH} are allowed"):
            for _ in range(MAX_DEPTH):
                t = any_of(on("train_start"), ~t)  # `any(not ...)` does not flatten
        assert MAX_DEPTH - 1 <= t.depth <= MAX_DEPTH


class TestPlanLimits:
    """plan works in time proportional to its firings, or refuses clearly."""

    def test_a_billion_epochs(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--epochs 1000000000 plans in memory proportional to the firings."""
        spec = tmp_path / "s.toml"
        spec.write_text('[clock]\nepochs = 1\nsteps_per_epoch = 1000\n[callbacks.a]\n'
                        'trigger = { every = "1000000 epochs" }\n')
        assert main(["plan", str(spec), "--epochs", "1000000000", "--format", "json"]) == 0
        assert capsys.readouterr().out.count('"callback"') == 1000

    def test_too_many_firings_are_cut_with_a_warning(self, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
        """A plan of more than MAX_FIRINGS firings says where it stopped."""
        spec = tmp_path / "s.toml"
        spec.write_text('[clock]\nepochs = 1000000\nsteps_per_epoch = 1000\n[callbacks.a]\n'
                        'trigger = { every = "1 epoch" }\n')
        from schedtrain.planning import plan_spec
        from schedtrain.spec import load_spec

        plan = plan_spec(load_spec(spec), max_firings=500)
        assert plan.truncated and len(plan.log) == 500


@st.composite
def _specs_with_one_dead(draw: st.DrawFn) -> tuple[str, str]:
    """Several callbacks with nested triggers; one of them (named ``dead``) can never fire."""
    n = draw(st.integers(1, 5))
    live = ['{ every = "2 steps" }', '{ any = [{ on = "train_end" }, { every = "1 epoch", '
            'start = "1 epoch" }] }', '{ all = [{ every = "3 steps" }, { not = { at = '
            '"6 steps" } }] }', '"named"']
    dead = ['{ every = "10 epochs", stop = "5 epochs" }',
            '{ all = [{ every = "3 steps" }, { every = "2 epochs" }] }',
            '{ any = [{ at = "5 steps", start = "10 steps" }, { at = "1 step", '
            'start = "2 steps" }] }']
    lines = ['[triggers.named]', 'every = "1 epoch"', 'start = "2 epochs"']
    where = draw(st.integers(0, n))
    for i in range(n + 1):
        name = "dead" if i == where else f"cb{i}"
        trig = draw(st.sampled_from(dead if i == where else live))
        lines += [f"[callbacks.{name}]", f"trigger = {trig}"]
    return "\n".join(lines) + "\n", "callbacks.dead.trigger"


class TestErrorPaths:
    """An error names the path where the problem is, never another callback's."""

    @settings(deadline=None)
    @given(_specs_with_one_dead())
    def test_never_firing_names_its_own_callback(self, case: tuple[str, str]) -> None:
        """The 'can never fire' problem is at the dead callback's trigger, and only there."""
        text, path = case
        with pytest.raises(SpecError) as info:
            loads_spec(text)
        assert len(info.value.problems) == 1
        assert info.value.problems[0].path.startswith(path)

    def test_problem_inside_a_named_trigger_is_at_its_definition(self) -> None:
        """An unknown event inside a named trigger is reported where the name is defined."""
        with pytest.raises(SpecError) as info:
            loads_spec('[triggers.t]\nany = [{ on = "train_end" }, { on = "trian_end" }]\n'
                       '[callbacks.a]\ntrigger = "t"\n[callbacks.b]\ntrigger = "t"\n')
        assert [p.path for p in info.value.problems] == ["triggers.t.any[1].on"]


def test_no_traceback_from_the_command_line(tmp_path: Path) -> None:
    """Through the real entry point, a bad spec prints errors and exits 2, no traceback."""
    import subprocess

    spec = tmp_path / "s.toml"
    spec.write_text(f"[callbacks.a]\ntrigger = {_nested(400)}\n")
    result = subprocess.run([sys.executable, "-m", "schedtrain", "check", str(spec)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


class TestImportedClassesAfterValidation:
    """A spec's classes are imported only once the spec is valid, and their arguments are
    checked against what ``__init__`` declares before anything is built."""

    def test_wrong_argument_types_name_their_key_paths(
            self, tmp_path: Path, capsys: pytest.CaptureFixture[str],
            monkeypatch: pytest.MonkeyPatch) -> None:
        """``check --import``: each mistyped argument at ``callbacks.NAME.ARG``, exit 2."""
        (tmp_path / "typedcb.py").write_text(textwrap.dedent("""
            from typing import Literal
            from schedtrain.callbacks import Callback

            class Cb(Callback):
                def __init__(self, k: int, mode: Literal["a", "b"] = "a",
                             names: list[str] | None = None, where: "Unknown" = None,
                             **kw) -> None:
                    super().__init__(**kw)
                    self.k = k
        """))
        monkeypatch.syspath_prepend(str(tmp_path))
        code, err = _check(tmp_path, """
            [callbacks.a]
            type = "typedcb:Cb"
            k = "x"
            mode = "c"
            names = 3
            where = 5
            trigger = { every = "1 epoch" }
        """, capsys, "--import")
        assert code == 2
        assert "callbacks.a.k: expected an integer (Cb declares 'k' so), found string 'x'" in err
        assert "callbacks.a.mode: expected 'a' or 'b'" in err
        assert "callbacks.a.names: expected a list" in err
        assert "callbacks.a.where" not in err  # a hint that does not resolve is not checked

    def test_a_refused_spec_imports_nothing(self, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
        """A custom trigger's module is not imported (nor run) when the spec is refused."""
        marker = tmp_path / "imported"
        (tmp_path / "noisy.py").write_text(
            f"open({str(marker)!r}, 'w').close()\n"
            "from schedtrain.triggers import Trigger\nclass T(Trigger):\n    pass\n")
        for command in (["check", "--import"], ["plan", "--import"], ["train"]):
            spec = tmp_path / "bad.toml"
            spec.write_text('[callbacks.a]\ntrigger = { custom = "noisy:T" }\n'
                            '[callbacks.b]\ntrigger = { every = "5steps" }\n')
            code = main([command[0], str(spec), *command[1:]])
            assert code == 2
            assert "callbacks.b.trigger.every" in capsys.readouterr().err
            assert not marker.exists()
