"""``HumanHyperParamSetter`` keeps training whatever sits at its file: a FIFO, a device,
a huge file, garbage, or a value the optimizer cannot use; the lr is left as it was and
one log line says why."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import every
from schedtrain.callbacks import HumanHyperParamSetter
from schedtrain.callbacks.human import MAX_BYTES
from schedtrain.callbacks.params import param_problem, value_problem
from schedtrain.training import Trainer

mse = torch.nn.functional.mse_loss


def _fit(run_dir: Path, param: str = "lr") -> tuple[Trainer, list[str]]:
    """Train 2 epochs of 3 steps, the setter firing at every step; the setter's log."""
    setter = HumanHyperParamSetter(param)
    setter.default_trigger = every("1 step")  # type: ignore[misc]
    model, opt = tiny_model()
    t = Trainer(model, opt, UnevenData([3, 3]), mse, callbacks=[setter], max_epochs=2,
                run_dir=run_dir, handle_signals=False)
    with structlog.testing.capture_logs() as logs:
        t.fit()
    return t, [f"{e['event']}: {e.get('message', e.get('value'))}" for e in logs
               if e["event"].startswith("human_hyperparam")]


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _huge(path: Path) -> None:
    path.write_bytes(b"# padding\n" * (MAX_BYTES // 10 + 1) + b"lr = 0.5\n")


def _text(text: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(text)


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "a FIFO": (_fifo, "is a FIFO, not a regular file"),
    "/dev/zero through a link": (_dev_zero, "is a device, not a regular file"),
    "a directory": (lambda p: p.mkdir(), "is a directory, not a regular file"),
    "a file over the size limit": (_huge, f"is longer than {MAX_BYTES:,} bytes"),
    "binary garbage": (_text(b"lr = \xff\xfe\x00\x01\n"), "can't decode byte"),
    "1e400": (_text(b"lr = 1e400\n"), "lr = 1e400 is not finite"),
    "10**400 written out": (_text(b"lr = 1" + b"0" * 400 + b"\n"), "is not finite"),
    "too large for float32": (_text(b"lr = 1e300\n"),
                              "1e+300 is larger than the model's torch.float32"),
    "an expression": (_text(b"lr = 10**400\n"), "is not a number"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_is_logged_and_training_goes_on(case: str, tmp_path: Path) -> None:
    """The run trains to its end (never blocks, never runs out of memory), the lr stays
    as it was, and the problem is logged once, naming the file."""
    plant, says = HOSTILE[case]
    plant(tmp_path / "hyper.txt")
    t, said = _fit(tmp_path)
    assert t.clock.step == 6
    assert t.optimizer.param_groups[0]["lr"] == 0.01
    assert len(said) == 1, said
    assert "hyper.txt" in said[0] and says in said[0], said


def test_a_link_to_a_regular_file_is_followed(tmp_path: Path) -> None:
    """A link the user made to a regular file is read like the file."""
    (tmp_path / "mine.txt").write_text("lr = 0.25\n")
    (tmp_path / "hyper.txt").symlink_to(tmp_path / "mine.txt")
    t, said = _fit(tmp_path)
    assert t.optimizer.param_groups[0]["lr"] == 0.25
    assert said == ["human_hyperparam_set: 0.25"]


@pytest.mark.parametrize("param", ["params", "betas", "nesterov", "foreach"])
def test_a_param_that_is_no_number_is_refused_before_training(param: str,
                                                              tmp_path: Path) -> None:
    """The params list, a missing key, a flag or None cannot be set: refused at setup,
    naming the callback, before any step."""
    with pytest.raises(ValueError, match=f"HumanHyperParamSetter\\): `param`: .*'{param}'"):
        _fit(tmp_path, param)


class TestRules:
    """The shared rule of what a setter may set, and to what."""

    def test_numeric_keys_are_settable(self) -> None:
        """Every numeric key of SGD's groups passes; the others say what would."""
        _, opt = tiny_model()
        for key in ("lr", "momentum", "dampening", "weight_decay"):
            assert param_problem(opt, key) is None
        problem = param_problem(opt, "params")
        assert problem is not None and "['dampening', 'lr', 'momentum', 'weight_decay']" \
            in problem

    @settings(max_examples=100, deadline=None)
    @given(st.floats())
    def test_a_value_is_usable_when_finite_and_in_the_dtypes_range(self,
                                                                     value: float) -> None:
        """Exactly the finite values within float32's range are usable by a float32
        model."""
        _, opt = tiny_model()
        usable = value_problem(opt, value) is None
        assert usable == (abs(value) <= torch.finfo(torch.float32).max)
