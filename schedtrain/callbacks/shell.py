"""``InjectShell``: touch a file to pause training and get an interactive shell.

Create ``RUN_DIR/shell`` (``touch runs/x/shell``); at the callback's next firing the
chief removes it and opens IPython (or Python's ``code.interact``) with ``trainer``,
``model``, ``optimizer`` and ``metrics`` in scope. Leaving the shell resumes training.
"""

from __future__ import annotations

import code
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from schedtrain.callbacks.base import Callback
from schedtrain.logs import get_logger
from schedtrain.triggers import Trigger, any_of, every

__all__ = ["InjectShell", "open_shell"]

_log = get_logger("schedtrain.callbacks")

ShellHook = Callable[[dict[str, Any], str], None]
"""Opens a shell: ``hook(namespace, banner)``; returns when the person leaves it."""


def open_shell(namespace: dict[str, Any], banner: str, shell: str = "ipython") -> None:
    """IPython when ``shell == "ipython"`` and it is installed, else ``code.interact``."""
    if shell == "ipython":
        try:
            from IPython.terminal.embed import InteractiveShellEmbed
        except ImportError:
            banner += "\n(IPython is not installed: a plain Python shell)"
        else:
            # Some IPython releases leave the constructor untyped: call it through Any.
            embed: Any = InteractiveShellEmbed
            embed(banner1=banner)(local_ns=namespace)
            return
    code.interact(banner=banner, local=namespace, exitmsg="training resumes")


class InjectShell(Callback):
    """When fired (default: every 100 steps and every epoch) and ``file`` exists: remove it
    and open an interactive shell; training waits until the shell is left.

    Only the chief opens a shell, and only when its stdin is a terminal; otherwise it
    logs once that the request is skipped (the file stays). Under several processes the
    other ranks wait for the chief at their next collective.

    Args:
        file: the file to touch, relative to the run directory (or to the working
            directory when the trainer has none).
        shell: ``"ipython"`` (falls back to Python's shell when IPython is missing) or
            ``"python"``.
        hook: what opens the shell (``hook(namespace, banner)``), for tests and embedding;
            default ``open_shell``.
    """

    default_trigger: ClassVar[Trigger] = any_of(every("100 steps"), every("1 epoch"))

    def __init__(self, file: str = "shell", shell: str = "ipython",
                 hook: ShellHook | None = None) -> None:
        if not isinstance(file, str) or not file.strip():
            raise ValueError(f"`file` must be a file name, got {file!r}")
        if shell not in ("ipython", "python"):
            raise ValueError(f"`shell` must be 'ipython' or 'python', got {shell!r}")
        self.file, self.shell = file, shell
        self.hook = hook
        self._skipped = False

    @property
    def path(self) -> Path:
        """The file that asks for a shell."""
        run_dir = self.trainer.run_dir
        return Path(self.file) if run_dir is None else run_dir / self.file

    def _trigger(self) -> None:
        path = self.path
        if not self.is_chief or not path.exists():
            return
        if not _interactive():
            if not self._skipped:
                self._skipped = True
                _log.info("inject_shell_skipped", callback=self.name, file=str(path),
                          reason="stdin is not a terminal")
            return
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        namespace = {"trainer": self.trainer, "model": self.model,
                     "optimizer": self.optimizer, "metrics": self.metrics}
        now = self.now
        banner = (f"schedtrain: paused at step {now.step}, epoch {now.epoch}. In scope: "
                  f"{', '.join(namespace)}. Leave the shell to resume training.")
        _log.info("inject_shell", callback=self.name, step=now.step)
        if self.hook is not None:
            self.hook(namespace, banner)
        else:
            open_shell(namespace, banner, self.shell)

    def state_dict(self) -> dict[str, Any]:
        return {}


def _interactive() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stdin
        return False
