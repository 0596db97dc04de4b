"""The random generators' state, as plain data and tensors a checkpoint can hold.

A resumed run must draw exactly what the uninterrupted one would have: Python's, NumPy's
(when installed), torch's CPU and CUDA generators are captured and restored together.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["preserved_rng", "rng_state", "seed_everything", "set_rng_state"]


def seed_everything(seed: int) -> None:
    """Seed Python's, torch's (and NumPy's, when installed) random generators."""
    random.seed(seed)
    torch.manual_seed(seed)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(seed % 2**32)


def rng_state() -> dict[str, Any]:
    """Every generator's state, as plain data and tensors."""
    version, keys, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(keys), gauss],
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    with contextlib.suppress(ImportError):
        import numpy as np

        name, np_keys, pos, has_gauss, cached = np.random.get_state()
        # tolist(): the same Python ints as int() of each key, without 624 NumPy scalars
        # (half of the snapshot the loop takes at every epoch start: docs/performance.md)
        state["numpy"] = [name, np.asarray(np_keys).tolist(), int(pos), int(has_gauss),
                          float(cached)]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore ``rng_state()``."""
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        name, np_keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(np_keys, dtype=np.uint32), pos, has_gauss, cached))


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore every generator on leaving: what runs inside (DCP building states) must
    not move them, or the uninterrupted run would differ from the resumed one."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)
