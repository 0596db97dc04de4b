"""``SendStat``: run a command with metric values in its arguments (tensorpack's SendStat).

The command is an argument list run without a shell, so a value can never be read as
shell syntax, and it is bounded in time. It runs on the chief only; a failure or a
timeout is logged and training goes on.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from schedtrain.callbacks.base import Callback
from schedtrain.logs import get_logger
from schedtrain.names import PLACEHOLDER_RE
from schedtrain.triggers import Trigger, every

__all__ = ["SendStat"]

_log = get_logger("schedtrain.callbacks")
#: Placeholders every command may use besides its metrics.
CLOCK_FIELDS: Final = ("step", "epoch", "run_dir")


class SendStat(Callback):
    """When fired (default: every epoch), run ``command`` with ``{metric}`` placeholders
    replaced by the metrics' newest values (``{step}``, ``{epoch}`` and ``{run_dir}`` too).

    Example: ``SendStat(["notify-send", "val error {val-error-top1}"],
    ["val-error-top1"])``. It reads the metrics when fired (a device sync) and skips the
    firing, with a log line, while one of them has no value yet.

    Args:
        command: the program and its arguments (no shell: use ``["sh", "-c", ...]``
            only if you mean it, and then never with untrusted values).
        metrics: the metrics the placeholders name.
        timeout: seconds the command may run before it is killed.
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("1 epoch")

    def __init__(self, command: Sequence[str], metrics: Sequence[str] = (),
                 timeout: float = 10.0) -> None:
        if (isinstance(command, str) or not command
                or not all(isinstance(a, str) for a in command)):
            raise ValueError("`command` must be a non-empty list of strings (the program and "
                             f"its arguments; no shell), got {command!r}")
        if isinstance(metrics, str) or not all(isinstance(m, str) and m for m in metrics):
            raise ValueError(f"`metrics` must be a list of metric names, got {metrics!r}")
        if (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                or not math.isfinite(timeout) or timeout <= 0):
            raise ValueError(f"`timeout` must be a number of seconds > 0, got {timeout!r}")
        known = (*metrics, *CLOCK_FIELDS)
        for i, arg in enumerate(command):
            for field in PLACEHOLDER_RE.findall(arg):
                if field not in known:
                    raise ValueError(f"`command[{i}]` names {{{field}}}, which is not in "
                                     f"`metrics` {list(metrics)} (nor {', '.join(CLOCK_FIELDS)})")
        self.command, self.metrics_names = list(command), tuple(metrics)
        self.timeout = float(timeout)
        self.needs = self.metrics_names

    def arguments(self, values: dict[str, float | str]) -> list[str]:
        """The command with each ``{name}`` replaced by ``values[name]``."""
        return [PLACEHOLDER_RE.sub(lambda m: _show(values[m[1]]), arg) for arg in self.command]

    def _trigger(self) -> None:
        if not self.is_chief:
            return
        now = self.now
        run_dir = self.trainer.run_dir
        values: dict[str, float | str] = {"step": now.step, "epoch": now.epoch,
                                          "run_dir": str(run_dir) if run_dir else "."}
        for name in self.metrics_names:
            got = self.metrics.latest(name)
            if got is None:
                _log.info("send_stat_skipped", callback=self.name, step=now.step,
                          reason=f"metric {name!r} has no value yet")
                return
            values[name] = got.value
        args = self.arguments(values)
        try:
            done = subprocess.run(args, timeout=self.timeout, capture_output=True,
                                  check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            _log.warning("send_stat_failed", callback=self.name, step=now.step,
                         reason=f"{args[0]!r} ran over its timeout of {self.timeout:g} s "
                                "and was killed")
        except OSError as exc:
            _log.warning("send_stat_failed", callback=self.name, step=now.step,
                         reason=f"cannot run {args[0]!r}: {exc}")
        else:
            if done.returncode != 0:
                _log.warning("send_stat_failed", callback=self.name, step=now.step,
                             reason=f"{args[0]!r} exited with {done.returncode}",
                             stderr=_tail(done.stderr))

    def state_dict(self) -> dict[str, Any]:
        return {}


def _show(value: float | str) -> str:
    if isinstance(value, str | int):
        return str(value)
    return f"{value:.6g}"


def _tail(data: bytes, limit: int = 500) -> str:
    return data.decode("utf-8", "replace")[-limit:].strip()
