"""Checkpoints: the one place that writes, reads, lists and deletes checkpoint files.

``Checkpoints`` (``manager``) is a run's checkpoint owner; ``files`` is the layout on
disk (names, atomic writes, listing), ``format`` what a file is (plain data, checksum),
``store`` reading and writing one file, ``sharded`` the directories FSDP2 ranks write
together through ``torch.distributed.checkpoint``, ``rng`` the generators' state.
"""

from schedtrain.checkpoints.files import checkpoint_name as checkpoint_name
from schedtrain.checkpoints.files import fsync_dir as fsync_dir
from schedtrain.checkpoints.files import list_checkpoints as list_checkpoints
from schedtrain.checkpoints.files import remove_leftovers as remove_leftovers
from schedtrain.checkpoints.files import replace_dir as replace_dir
from schedtrain.checkpoints.files import write_atomic as write_atomic
from schedtrain.checkpoints.format import FORMAT as FORMAT
from schedtrain.checkpoints.format import STATE_FILE as STATE_FILE
from schedtrain.checkpoints.format import CheckpointError as CheckpointError
from schedtrain.checkpoints.format import digest as digest
from schedtrain.checkpoints.format import file_digests as file_digests
from schedtrain.checkpoints.format import is_finite as is_finite
from schedtrain.checkpoints.manager import Checkpoints as Checkpoints
from schedtrain.checkpoints.store import newest_valid as newest_valid
from schedtrain.checkpoints.store import read_checkpoint as read_checkpoint
from schedtrain.checkpoints.store import write_checkpoint as write_checkpoint

__all__ = ["FORMAT", "STATE_FILE", "CheckpointError", "Checkpoints", "checkpoint_name",
           "digest", "file_digests", "fsync_dir", "is_finite", "list_checkpoints",
           "newest_valid", "read_checkpoint", "remove_leftovers", "replace_dir",
           "write_atomic", "write_checkpoint"]
