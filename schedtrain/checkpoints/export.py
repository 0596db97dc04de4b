"""Model weights exported for other tools: safetensors files beside a run's checkpoints.

A checkpoint is schedtrain's own (pickled plain data, loaded with ``torch.load``); an
export holds only the model's weights in a format other tools read without schedtrain
or pickle (Hugging Face ``from_pretrained``, ``safetensors.torch.load_file``). Files are
written by ``files.write_atomic``: a crash leaves the previous export or the new one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from schedtrain._version import __version__
from schedtrain.checkpoints.format import CheckpointError
from schedtrain.files import write_atomic
from schedtrain.spec.run import EXPORT_FORMATS

__all__ = ["EXPORT_FORMATS", "ExportError", "export_weights", "safetensors_bytes"]


class ExportError(CheckpointError):
    """An export that cannot be written (its path and why)."""


def _plain(state: Mapping[str, Any], path: Path) -> dict[str, torch.Tensor]:
    """The state's tensors on the host, contiguous, each with storage of its own.

    safetensors refuses tensors that share storage (tied weights): every name after the
    first of a storage gets its own copy, so the file keeps every key of the state dict
    and loads into a fresh model with ``load_state_dict`` as it is.
    """
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise ExportError(path, f"the model's state entry {name!r} is a "
                                    f"{type(value).__name__}, not a tensor; safetensors "
                                    "holds tensors only")
        tensor = value.detach().to("cpu").contiguous()
        storage = tensor.untyped_storage()
        # A second name on one storage (tied weights), or a view of part of a larger
        # one: a copy of its own, as safetensors asks.
        if (storage.data_ptr() in seen
                or tensor.numel() * tensor.element_size() != storage.nbytes()):
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        out[name] = tensor
    return out


def safetensors_bytes(state: Mapping[str, Any], path: Path, *, step: int,
                      epoch: int) -> bytes:
    """``state`` (a model's state dict) serialised as safetensors, with the step, epoch
    and schedtrain version as string metadata."""
    try:
        from safetensors.torch import save
    except ImportError:
        raise ExportError(path, "export = ['safetensors'] needs the safetensors package: "
                                "pip install 'schedtrain[export]'") from None
    metadata = {"format": "pt", "step": str(step), "epoch": str(epoch),
                "schedtrain": __version__}
    return save(_plain(state, path), metadata=metadata)


def export_weights(state: Mapping[str, Any], path: Path, *, step: int, epoch: int) -> Path:
    """Write ``state`` to ``path`` as safetensors, atomically (never through a link)."""
    data = safetensors_bytes(state, path, step=step, epoch=epoch)
    return write_atomic(path, lambda f: f.write(data))
