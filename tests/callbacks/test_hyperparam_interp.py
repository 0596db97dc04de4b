"""ScheduledHyperParamSetter's interpolation: exact at the points, between them as named."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain.callbacks import ScheduledHyperParamSetter
from schedtrain.training import Trainer

_value = st.floats(-10, 10, allow_nan=False, allow_subnormal=False)
_points = st.lists(st.tuples(st.integers(0, 1000), _value), min_size=1, max_size=8,
                   unique_by=lambda p: p[0]).map(sorted)
_interp = st.sampled_from(["step", "linear", "cosine"])


@given(_points, _interp)
def test_every_point_gets_its_value_exactly(points: list[tuple[int, float]],
                                            interp: str) -> None:
    """At each listed point the value is the listed one, bit for bit; before the first,
    None; after the last, the last."""
    setter = ScheduledHyperParamSetter("lr", points, interp=interp)
    for x, y in points:
        assert setter.value_at(x) == y
    assert setter.value_at(points[-1][0] + 0.5) == points[-1][1]
    if points[0][0] > 0:
        assert setter.value_at(points[0][0] - 0.5) is None


@given(_points, _interp, st.integers(0, 1000), st.integers(0, 6))
def test_between_points_the_value_goes_one_way(points: list[tuple[int, float]], interp: str,
                                               offset: int, index: int) -> None:
    """Between two points the value stays between their values, moving monotonically;
    "step" keeps the first one's."""
    assume(len(points) >= 2)
    i = index % (len(points) - 1)
    (x0, y0), (x1, y1) = points[i], points[i + 1]
    setter = ScheduledHyperParamSetter("lr", points, interp=interp)
    x = x0 + offset % (x1 - x0)  # the clock counts in whole steps (epochs)
    got = setter.value_at(x)
    assert got is not None
    if interp == "step":
        assert got == y0
        return
    lo, hi = min(y0, y1), max(y0, y1)
    assert lo - 1e-9 <= got <= hi + 1e-9
    later = setter.value_at(x + 1)
    assert later is not None
    assert (later - got) * (y1 - y0) >= -1e-9


@given(st.integers(1, 99))
def test_cosine_and_linear_shapes(percent: int) -> None:
    """From 1 to 0 over 100 steps: linear is 1 - t, cosine is (1 + cos(pi t)) / 2."""
    t = percent / 100
    lin = ScheduledHyperParamSetter("lr", [(0, 1.0), (100, 0.0)], interp="linear")
    cos = ScheduledHyperParamSetter("lr", [(0, 1.0), (100, 0.0)], interp="cosine")
    assert lin.value_at(percent) == pytest.approx(1 - t)
    assert cos.value_at(percent) == pytest.approx((1 + math.cos(math.pi * t)) / 2)


@pytest.mark.parametrize("interp", ["linear", "cosine", "step", None])
def test_trained_lr_follows_value_at(interp: str | None) -> None:
    """In training, the lr used at step s is value_at(s - 1) (points count completed steps)."""
    model, opt = tiny_model()
    setter = ScheduledHyperParamSetter("lr", [(0, 0.1), (4, 0.01), (9, 0.05)], interp=interp,
                                       step_based=True)
    seen: list[float] = []

    def step_fn(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        seen.append(opt.param_groups[0]["lr"])
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    Trainer(model, opt, UnevenData([12]), step_fn=step_fn, callbacks=[setter],
            max_epochs=1).fit()
    assert seen == [setter.value_at(s) for s in range(12)]


def test_unknown_interpolation_is_refused() -> None:
    """A misspelt interp names the choices."""
    with pytest.raises(ValueError, match="`interp` must be one of 'step', 'linear', 'cosine'"):
        ScheduledHyperParamSetter("lr", [(0, 1.0)], interp="cos")


def _toml(interp: str) -> str:
    return ('[callbacks.lr]\ntype = "ScheduledHyperParamSetter"\nparam = "lr"\n'
            f'schedule = [[0, 0.1], [10, 0.001]]\ninterp = "{interp}"\nstep_based = true\n'
            'trigger = { every = "1 step" }\n')


def test_toml_takes_the_interpolation_by_name() -> None:
    """`interp = "cosine"` builds the same setter as Python; a wrong name is refused at
    its key path with the choices."""
    from schedtrain import SpecError
    from schedtrain.spec import loads_spec
    from schedtrain.training.from_spec import build_callbacks

    setter = build_callbacks(loads_spec(_toml("cosine")))["lr"]
    assert setter.interp == "cosine"
    assert setter.value_at(5) == pytest.approx(0.0505)
    with pytest.raises(SpecError, match=r"callbacks\.lr\.interp: expected 'step', 'linear' "
                                        r"or 'cosine', found string 'cos'"):
        loads_spec(_toml("cos"))
