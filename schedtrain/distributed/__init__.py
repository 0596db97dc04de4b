"""Several processes (``torchrun``): agreement between ranks, model wrapping, data sharding.

See docs/distributed.md. Everything here is used by the trainer; user code rarely
needs more than ``World.from_env()``. ``vocabulary`` (what ``[run]`` may ask and the
arithmetic of reduced values) is torch-free: the spec and the simulation read it, so
this package loads its torch parts only when one of their names is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

from schedtrain.distributed.vocabulary import REDUCE_OPS as REDUCE_OPS
from schedtrain.distributed.vocabulary import STRATEGIES as STRATEGIES

_EXPORTS: Final = {
    "Comm": "schedtrain.distributed.comm", "World": "schedtrain.distributed.comm",
    "shard_loader": "schedtrain.distributed.wrap", "wrap_model": "schedtrain.distributed.wrap",
}  # fmt: skip

__all__ = ["REDUCE_OPS", "STRATEGIES", "Comm", "World", "shard_loader", "wrap_model"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'schedtrain.distributed' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


if TYPE_CHECKING:
    from schedtrain.distributed.comm import Comm as Comm
    from schedtrain.distributed.comm import World as World
    from schedtrain.distributed.wrap import shard_loader as shard_loader
    from schedtrain.distributed.wrap import wrap_model as wrap_model
