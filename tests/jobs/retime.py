"""A callback that asks its own run to retime, as ``schedtrain retime`` would."""

from __future__ import annotations

from schedtrain.callbacks import Callback
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import write_request
from schedtrain.spec import load_spec


class AskRetime(Callback):
    """When it fires, the chief writes a request for ``spec``'s schedule (a path beside
    the run directory)."""

    def __init__(self, spec: str) -> None:
        super().__init__()
        self.spec = spec

    def _trigger(self) -> None:
        run_dir = self.trainer.run_dir
        if self.rank != 0 or run_dir is None:
            return
        text = canonical(load_spec(run_dir.parent / self.spec).schedule())
        assert text is not None
        write_request(run_dir, text)
