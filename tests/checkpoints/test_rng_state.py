"""The generators' state a checkpoint holds: plain data that restores every draw."""

from __future__ import annotations

import io
import random

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain.checkpoints.rng import rng_state, set_rng_state


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.random()), torch.rand(3).tolist()


class TestRngState:
    """``rng_state`` and ``set_rng_state``."""

    @settings(max_examples=20, deadline=None)
    @given(st.integers(0, 2**32 - 1), st.integers(0, 700))
    def test_restores_every_generator(self, seed: int, moves: int) -> None:
        """Restoring the state taken anywhere in NumPy's key cycle (``moves`` draws in)
        gives the same Python, NumPy and torch draws as before."""
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        np.random.random(moves)
        state = rng_state()
        first = _draws()
        set_rng_state(state)
        assert _draws() == first

    def test_numpy_keys_are_plain_ints(self) -> None:
        """NumPy's key is a list of Python ints equal to its generator's key, so the state
        loads with ``torch.load(weights_only=True)``."""
        np.random.seed(7)
        keys = np.random.get_state()[1]
        state = rng_state()
        assert state["numpy"][1] == [int(k) for k in keys]
        assert {type(k) for k in state["numpy"][1]} == {int}
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        assert torch.load(buffer, weights_only=True)["numpy"] == state["numpy"]
