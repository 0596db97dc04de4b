"""Several processes (``torchrun``): agreement between ranks, model wrapping, data sharding.

See docs/distributed.md. Everything here is used by the trainer; user code rarely
needs more than ``World.from_env()``.
"""

from schedtrain.distributed.comm import REDUCE_OPS as REDUCE_OPS
from schedtrain.distributed.comm import Comm as Comm
from schedtrain.distributed.comm import World as World
from schedtrain.distributed.wrap import STRATEGIES as STRATEGIES
from schedtrain.distributed.wrap import shard_loader as shard_loader
from schedtrain.distributed.wrap import wrap_model as wrap_model

__all__ = ["REDUCE_OPS", "STRATEGIES", "Comm", "World", "shard_loader", "wrap_model"]
