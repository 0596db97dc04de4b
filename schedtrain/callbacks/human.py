"""``HumanHyperParamSetter``: set a hyper-parameter from a file a person edits mid-run.

The file (``RUN_DIR/hyper.txt`` by default) holds ``name = value`` lines; ``#`` starts a
comment and ``name: value`` works too, so one file can serve several setters::

    # edit while training runs; read each time the setter fires
    lr = 0.01
    momentum = 0.9

A missing or bad file is never fatal: the setter logs what is wrong, once per change
of what it finds, and leaves the optimizer alone. It reads only a regular file (a link
to one is followed) of at most ``MAX_BYTES``, and opening it never blocks: a FIFO, a
device such as ``/dev/zero`` or a huge file is reported and skipped, as is a value the
optimizer could not use (not finite, or too large for the parameters' dtype).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, Final

from schedtrain.callbacks.base import Callback
from schedtrain.callbacks.params import param_problem, value_problem
from schedtrain.errors import RunDirError
from schedtrain.files import read_regular
from schedtrain.logs import get_logger
from schedtrain.triggers import Trigger, every

__all__ = ["MAX_BYTES", "HumanHyperParamSetter", "read_value"]

#: The longest file the setter reads: a few lines a person wrote.
MAX_BYTES: Final = 64 * 1024

_log = get_logger("schedtrain.callbacks")


def read_value(text: str, param: str) -> float | None:
    """The value the last ``param = value`` line of ``text`` gives, or ``None`` without one.

    Raises:
        ValueError: that line's value is not a finite number (the message says which line).
    """
    found: float | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        sep = "=" if "=" in line else ":"
        key, has_sep, value = line.partition(sep)
        if not has_sep or key.strip() != param:
            continue
        try:
            found = float(value.strip())  # a number too long for a float is inf
        except ValueError:
            raise ValueError(f"line {number}: {param} = {value.strip()!r} is not a number") \
                from None
        if not math.isfinite(found):
            raise ValueError(f"line {number}: {param} = {value.strip()} is not finite")
    return found


class HumanHyperParamSetter(Callback):
    """Each time it fires (default: every epoch), set ``param`` in every optimizer param
    group to the value ``file`` gives, so a person can change it without stopping the run.

    While the file names ``param`` it wins over other setters at each firing (declare
    it after a ``ScheduledHyperParamSetter`` of the same param). Every process reads the
    file, so it must be visible to all of them (one machine, or a shared run directory).

    Args:
        param: the param-group key (``"lr"``, ``"momentum"``...).
        file: the file, relative to the run directory (or to the working directory when
            the trainer has none).
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("1 epoch")

    def __init__(self, param: str = "lr", file: str = "hyper.txt") -> None:
        if not isinstance(param, str) or not param.strip():
            raise ValueError(f"`param` must be a param-group key such as 'lr', got {param!r}")
        if not isinstance(file, str) or not file.strip():
            raise ValueError(f"`file` must be a file name, got {file!r}")
        self.param, self.file = param, file
        #: the last value this setter applied (saved in checkpoints)
        self.value: float | None = None
        self._said: str | None = None

    @property
    def path(self) -> Path:
        """Where the file is read from."""
        run_dir = self.trainer.run_dir
        return Path(self.file) if run_dir is None else run_dir / self.file

    def optimizer_problem(self, optimizer: Any) -> str | None:
        """Why this setter cannot set ``param`` in ``optimizer`` (``check`` asks)."""
        return param_problem(optimizer, self.param)

    def _setup(self) -> None:
        problem = self.optimizer_problem(self.optimizer)
        if problem is not None:
            raise ValueError(f"callback {self.name!r} (HumanHyperParamSetter): `param`: "
                             f"{problem}")

    def _trigger(self) -> None:
        path = self.path
        try:
            text = read_regular(path, MAX_BYTES).decode("utf-8")
            value = read_value(text, self.param)
        except FileNotFoundError:
            self._say("human_hyperparam_no_file", f"{path} does not exist; write "
                      f"'{self.param} = VALUE' in it to set {self.param}")
            return
        except RunDirError as exc:  # not a regular file, or too long: it names the path
            self._say("human_hyperparam_bad_file", f"{exc}; {self.param} unchanged")
            return
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self._say("human_hyperparam_bad_file", f"{path}: {exc}; {self.param} unchanged")
            return
        if value is None:
            self._say("human_hyperparam_no_value", f"{path} has no '{self.param} = VALUE' "
                      f"line; {self.param} unchanged")
            return
        problem = value_problem(self.optimizer, value)
        if problem is not None:
            self._say("human_hyperparam_bad_value", f"{path}: {self.param} = {problem}; "
                      f"{self.param} unchanged")
            return
        for group in self.optimizer.param_groups:
            group[self.param] = value
        self._said = None
        if value == self.value:
            return
        self.value = value
        _log.info("human_hyperparam_set", callback=self.name, param=self.param, value=value,
                  file=str(path), step=self.now.step)

    def _say(self, event: str, message: str) -> None:
        """Log ``message`` unless it is what was said last (a problem is logged once)."""
        if message != self._said:
            self._said = message
            _log.info(event, callback=self.name, message=message)

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]
