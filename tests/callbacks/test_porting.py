"""Lineage hooks schedtrain never calls: warned at class definition, reported by
``schedtrain check --import``, quoted by docs/migrating.md, and really never called."""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from training_helpers import UnevenData, tiny_model

import schedtrain
import schedtrain.callbacks
from schedtrain.callbacks import Callback, PortingWarning
from schedtrain.callbacks.porting import LINEAGE_HOOKS, markdown_rows, porting_message
from schedtrain.cli import main
from schedtrain.training import Trainer

DOCS = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"
#: Every method and attribute of the base class: names schedtrain calls or provides.
CALLED = sorted(n for n in dir(Callback) if not n.startswith("__"))


def _lightning(self: Any, trainer: Any, pl_module: Any, stage: Any) -> None:
    """A hook with Lightning's arguments."""


def _flexible(self: Any, *args: Any, **kwargs: Any) -> None:
    """A hook taking whatever schedtrain passes."""


def _define(*hooks: str, body: Any = _lightning) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        type("Ported", (Callback,), dict.fromkeys(hooks, body))
    return [w for w in seen if issubclass(w.category, PortingWarning)]


#: ``keras.callbacks.Callback``'s hooks (Keras 3's documentation; ``set_model`` and
#: ``set_params`` are setters a class of one's own may well define, so they do not warn).
KERAS_HOOKS = [f"on_{loop}{what}_{when}" for loop, what in (
    ("train", ""), ("train", "_batch"), ("test", ""), ("test", "_batch"), ("predict", ""),
    ("predict", "_batch")) for when in ("begin", "end")] + [
    f"on_{what}_{when}" for what in ("epoch", "batch") for when in ("begin", "end")]


@pytest.mark.parametrize("hook", KERAS_HOOKS)
def test_keras_hooks_warn_naming_keras(hook: str) -> None:
    """E11: a Keras hook (``on_epoch_end(self, epoch, logs=None)``) warns naming Keras, and
    Lightning too where the name is Lightning's as well; Keras's test hooks say what they
    are in Keras (fit's validation)."""
    def keras_style(self: Any, epoch: int, logs: Any = None) -> None:
        """A hook with Keras's arguments."""

    [warning] = _define(hook, body=keras_style)
    text = str(warning.message)
    lightning = hook in {"on_train_end", "on_epoch_end", "on_train_batch_end",
                         "on_batch_end", "on_test_batch_end", "on_test_end",
                         "on_predict_batch_end", "on_predict_end"}
    library = "a Keras and Lightning hook" if lightning else "a Keras hook"
    assert f"Ported defines {hook}, {library} that schedtrain never calls" in text
    if hook.startswith("on_test"):
        assert "validation" in text and "eval_" in text


class TestWarning:
    """``PortingWarning`` when the class is defined."""

    @pytest.mark.parametrize("hook", sorted(LINEAGE_HOOKS))
    def test_each_lineage_hook(self, hook: str) -> None:
        """Every hook of the table warns once, naming the class, the hook, its library and
        what to write instead, on one line."""
        seen = _define(hook)
        entry = LINEAGE_HOOKS[hook]
        assert [str(w.message) for w in seen] == [porting_message("Ported", entry)]
        text = str(seen[0].message)
        assert text.startswith(f"Ported defines {hook}")
        assert entry.library in text and "\n" not in text
        assert entry.instead.replace("`", "") in text

    @pytest.mark.parametrize("name", CALLED)
    def test_names_schedtrain_calls_never_warn(self, name: str) -> None:
        """A class overriding any name of ``Callback`` (hooks it calls, state_dict...) with
        arguments schedtrain passes gets no warning; the table names none of them but those
        it calls with fewer arguments than Lightning."""
        assert name not in LINEAGE_HOOKS or LINEAGE_HOOKS[name].passes is not None
        assert _define(name, body=_flexible) == []

    @pytest.mark.parametrize("name", ["setup", "on_exception"])
    def test_lightning_arguments_on_a_called_name(self, name: str) -> None:
        """``setup(self, trainer, pl_module, stage)`` / ``on_exception(self, trainer,
        pl_module, exc)`` warn (schedtrain calls them with one argument); the schedtrain
        forms do not."""
        [warning] = _define(name)
        assert str(warning.message).startswith(
            f"Ported defines {name} with Lightning's arguments, which schedtrain does not "
            "pass: write _")

        def one_arg(self: Any, arg: Any) -> None: ...

        assert _define(name, body=one_arg) == []

    def test_once_per_class_and_hook(self) -> None:
        """Two hooks: two warnings; a subclass that does not define them again: none."""
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")

            class Lit(Callback):
                def on_train_start(self, trainer: Any, module: Any) -> None: ...

                def on_load_checkpoint(self, *args: Any) -> None: ...

            class Child(Lit):
                def _before_epoch(self) -> None: ...

        ported = [w for w in seen if issubclass(w.category, PortingWarning)]
        assert [str(w.message).split(",")[0] for w in ported] == [
            "TestWarning.test_once_per_class_and_hook.<locals>.Lit defines on_train_start",
            "TestWarning.test_once_per_class_and_hook.<locals>.Lit defines on_load_checkpoint"]
        assert ported[0].filename == __file__  # the class statement, not schedtrain's code
        assert Child.__mro__[1] is Lit

    def test_exported(self) -> None:
        """``PortingWarning`` is a ``UserWarning`` importable from schedtrain and its
        callbacks package."""
        assert schedtrain.PortingWarning is schedtrain.callbacks.PortingWarning
        assert issubclass(PortingWarning, UserWarning)


class TestNeverCalled:
    """The table's claim holds: the trainer calls none of those names."""

    def test_training_calls_none(self) -> None:
        """A callback defining every hook of the table (but the two schedtrain calls with
        its own arguments) trains 2 epochs without any of them running."""
        calls: list[str] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PortingWarning)
            Everything = type("Everything", (Callback,), {
                name: _recorder(calls, name) for name, hook in LINEAGE_HOOKS.items()
                if hook.passes is None})
        model, opt = tiny_model()
        Trainer(model, opt, UnevenData([3, 3]), torch.nn.functional.mse_loss,
                callbacks=[Everything()], max_epochs=2).fit()
        assert calls == []


def _recorder(calls: list[str], hook: str) -> Any:
    def record(self: Callback, *args: Any, **kwargs: Any) -> None:
        calls.append(hook)
    return record


def test_docs_quote_the_table() -> None:
    """docs/migrating.md holds the table's rows, all of them, in its order."""
    lines = DOCS.read_text().splitlines()
    quoted = [ln for ln in lines if ln.startswith("| `") and ln.split("`")[1] in LINEAGE_HOOKS
              and ln.count(" | ") == 2]
    assert quoted == markdown_rows()


class TestCheckImport:
    """``schedtrain check --import`` lists each one for the spec's callback classes."""

    def test_one_line_each_exit_unchanged(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
        """A Lightning-style class: one warning line per hook with its key path, the
        inherited ones too; exit code 0 as without them; no Python warning output."""
        (tmp_path / "lightning_style.py").write_text(textwrap.dedent("""
            from schedtrain.callbacks import Callback

            class Printer(Callback):
                def on_init_end(self, trainer):
                    print("trainer is init now")

                def on_train_end(self, trainer, pl_module):
                    print("do something when training ends")

            class Louder(Printer):
                def _trigger(self):
                    pass
        """))
        monkeypatch.syspath_prepend(str(tmp_path))
        sys.modules.pop("lightning_style", None)
        spec = tmp_path / "s.toml"
        spec.write_text(textwrap.dedent("""
            [callbacks.printer]
            type = "lightning_style:Louder"
            trigger = { on = "train_end" }
        """))
        assert main(["check", str(spec), "--import"]) == 0
        err = capsys.readouterr().err.splitlines()
        lines = [ln for ln in err if "never calls" in ln]
        assert lines == [
            f"warning: {spec}: callbacks.printer: Louder defines on_init_end, a "
            "pytorch-accelerated and Lightning hook that schedtrain never calls: write "
            "_setup(self): once, with self.trainer bound",
            f"warning: {spec}: callbacks.printer: Louder defines on_train_end, a Keras and "
            'Lightning hook that schedtrain never calls: write _after_train(self), or the '
            'trigger on = "train_end" with _trigger']
        assert not any("PortingWarning" in ln for ln in err)
        assert main(["check", str(spec)]) == 0  # without --import nothing is imported
        assert "never calls" not in capsys.readouterr().err

    def test_trigger_epoch_and_trigger_in_a_spec(self, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
        """A spec gives every callback a trigger, so a tensorpack-style class overriding
        ``_trigger_epoch`` and ``_trigger`` runs both: check --import says so, exit 0."""
        (tmp_path / "tensorpack_style.py").write_text(textwrap.dedent("""
            from schedtrain.callbacks import Callback

            class Setter(Callback):
                def _trigger_epoch(self):
                    self.trigger()

                def _trigger(self):
                    pass
        """))
        monkeypatch.syspath_prepend(str(tmp_path))
        sys.modules.pop("tensorpack_style", None)
        spec = tmp_path / "s.toml"
        spec.write_text(textwrap.dedent("""
            [callbacks.lr]
            type = "tensorpack_style:Setter"
            trigger = { every = "1 epoch" }
        """))
        assert main(["check", str(spec), "--import"]) == 0
        err = capsys.readouterr().err
        assert (f"warning: {spec}: callbacks.lr: Setter overrides _trigger_epoch and _trigger: "
                "_trigger runs at this trigger and _trigger_epoch after every epoch as well"
                in err)
