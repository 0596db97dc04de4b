"""Compatibility names: import paths that moved, kept working for one minor version.

Each old path in ``MOVED`` imports as the module that replaced it (the same module
object, so classes and functions are identical under both names) and warns with a
``DeprecationWarning`` naming the new path. ``install()`` (run by ``import schedtrain``)
puts the finder that does this on ``sys.meta_path``; it answers only for the paths
listed here. The list and CHANGELOG.md say when each goes away.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Final, cast

if TYPE_CHECKING:  # importlib.abc costs ~50 ms to import: the loader is duck-typed
    from importlib.abc import Loader

__all__ = ["MOVED", "REMOVED_IN", "install"]

#: The release in which the old paths stop working.
REMOVED_IN: Final = "0.3"

#: Old module path -> the module that holds its names now.
MOVED: Final[dict[str, str]] = {
    "schedtrain.analysis": "schedtrain.schedule.analysis",
    "schedtrain.dues": "schedtrain.schedule.dues",
    "schedtrain.firings": "schedtrain.schedule.firings",
    "schedtrain.table": "schedtrain.schedule.table",
    "schedtrain.triggers.tensorpack": "schedtrain.schedule.tensorpack",
    "schedtrain.kleene": "schedtrain.triggers.kleene",
    "schedtrain.simclock": "schedtrain.simulation.simclock",
    "schedtrain.ranks_sim": "schedtrain.simulation.ranks",
    "schedtrain.metric_stream": "schedtrain.simulation.metric_stream",
    "schedtrain.plan_render": "schedtrain.planning.render",
    "schedtrain.entry": "schedtrain.cli.entry",
    "schedtrain.registry": "schedtrain.spec.registry",
    "schedtrain.toml_writer": "schedtrain.spec.write",
    "schedtrain.training.checkpoint": "schedtrain.checkpoints",
    "schedtrain.training.sharded": "schedtrain.checkpoints.sharded",
    "schedtrain.training.state": "schedtrain.training.data_position",
    "schedtrain.training.main": "schedtrain.training.from_spec",
    "schedtrain.training.retime": "schedtrain.training.control.retime",
    "schedtrain.training.schedule_change": "schedtrain.training.control.schedule_change",
    "schedtrain.planning.retime": "schedtrain.planning.requests",
}


class _Alias:
    """Loads an old path as the module that replaced it (an import loader)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new}; import it from there (the old path "
                      f"stops working in {REMOVED_IN})", DeprecationWarning,
                      stacklevel=2)  # warnings skips the import machinery's frames
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module is the new one, already imported."""


class _MovedFinder:
    """Finds the old paths of ``MOVED``, and nothing else (a meta path finder)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, cast("Loader", _Alias(new)))


def install() -> None:
    """Put the finder for moved paths on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
