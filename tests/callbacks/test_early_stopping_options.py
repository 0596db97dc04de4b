"""EarlyStopping's Lightning options: check_finite, stopping_threshold, divergence_threshold;
the real run and ``plan --metrics`` stop at the same check, for the same reason."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import UnevenData, tiny_model

from schedtrain import SpecError
from schedtrain.callbacks import Callback
from schedtrain.callbacks.stopping import EarlyStopping
from schedtrain.planning.plan import plan_spec
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer

mse = torch.nn.functional.mse_loss


class Feed(Callback):
    """Puts the scripted ``val/loss`` of each epoch (a validation stand-in)."""

    may_stop_alone = False
    produces = ("val/loss",)

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def _trigger(self) -> None:
        self.metrics.put("val/loss", self.values[self.now.epoch - 1])


def _run(values: list[float], **kw: object) -> Trainer:
    model, opt = tiny_model()
    t = Trainer(model, opt, UnevenData([1] * len(values)), mse,
                callbacks=[Feed(values), EarlyStopping(**kw)],  # type: ignore[arg-type]
                max_epochs=len(values))
    t.fit()
    return t


class TestLightningOptions:
    """Each option stops where Lightning's does, and says why."""

    def test_not_finite_stops_at_once(self) -> None:
        """A NaN value stops at that check, not after `patience` checks; the reason says so."""
        t = _run([3.0, 2.0, math.nan, 1.0, 0.5], patience=3)
        assert t.stopped and t.clock.epoch == 3
        assert "val/loss = nan is not finite (best 2)" in (t.stopped.reason if t.stopped else "")

    def test_check_finite_off_counts_nan_as_no_improvement(self) -> None:
        """check_finite=False: NaN is only a check without a new best."""
        t = _run([3.0, math.nan, math.nan, 5.0, 1.0], patience=3, check_finite=False)
        assert t.stopped and t.clock.epoch == 4
        assert "did not improve for 3 checks" in (t.stopped.reason if t.stopped else "")

    @pytest.mark.parametrize(("mode", "values", "threshold", "epoch"), [
        ("min", [3.0, 1.0, 0.5, 0.2], 0.5, 4),   # 0.5 is not below 0.5: strictly better
        ("max", [0.1, 0.9, 0.95, 0.99], 0.9, 3),
    ])
    def test_stopping_threshold(self, mode: str, values: list[float], threshold: float,
                                epoch: int) -> None:
        """Stops at the first value strictly better than stopping_threshold."""
        t = _run(values, patience=10, mode=mode, stopping_threshold=threshold)
        assert t.stopped and t.clock.epoch == epoch
        assert "stopping_threshold" in (t.stopped.reason if t.stopped else "")

    def test_divergence_threshold(self) -> None:
        """Stops at the first value strictly worse than divergence_threshold."""
        t = _run([1.0, 5.0, 10.0, 10.5, 0.1], patience=10, divergence_threshold=10.0)
        assert t.stopped and t.clock.epoch == 4
        assert "val/loss = 10.5 > divergence_threshold 10" in t.stopped.reason

    def test_thresholds_need_patience(self) -> None:
        """Without patience every firing stops: a threshold would be ignored, so refused."""
        with pytest.raises(ValueError, match="`stopping_threshold` needs `patience`"):
            EarlyStopping(stopping_threshold=0.1)
        with pytest.raises(ValueError, match="`divergence_threshold` must be a finite number"):
            EarlyStopping(patience=2, divergence_threshold=math.inf)

    def test_toml_keys_checked(self) -> None:
        """TOML: the keys are accepted, their types checked, thresholds need patience."""
        head = '[callbacks.stop]\ntype = "EarlyStopping"\ntrigger = { every = "1 epoch" }\n'
        spec = loads_spec(head + "patience = 2\ncheck_finite = false\n"
                          "stopping_threshold = 0.1\ndivergence_threshold = 9\n")
        assert spec.callbacks["stop"].args["divergence_threshold"] == 9
        with pytest.raises(SpecError) as bad:
            loads_spec(head + 'check_finite = "yes"\n')
        assert "callbacks.stop.check_finite: expected true or false" in str(bad.value)
        with pytest.raises(SpecError) as bad:
            loads_spec(head + "stopping_threshold = 0.1\n")
        assert "callbacks.stop.stopping_threshold: needs patience" in str(bad.value)


VALUES = st.lists(st.one_of(st.floats(0, 10), st.sampled_from([math.nan, math.inf])),
                  min_size=1, max_size=8)


@settings(max_examples=25, deadline=None)
@given(VALUES, st.fixed_dictionaries({
    "patience": st.integers(1, 3), "mode": st.sampled_from(["min", "max"]),
    "check_finite": st.booleans(), "stopping_threshold": st.one_of(st.none(), st.floats(0, 10)),
    "divergence_threshold": st.one_of(st.none(), st.floats(0, 10))}))
def test_plan_stops_where_the_run_stops(values: list[float], args: dict[str, object]) -> None:
    """Given the run's metric stream, plan ends at the run's stopping check, same reason."""
    given_args = {k: v for k, v in args.items() if v is not None}
    t = _run(values, **given_args)
    toml = "\n".join(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}"
                     for k, v in given_args.items())
    spec = loads_spec(textwrap.dedent(f"""
        [clock]
        epochs = {len(values)}
        steps_per_epoch = 1
        [callbacks.feed]
        trigger = {{ every = "1 epoch" }}
        [callbacks.EarlyStopping]
        type = "EarlyStopping"
        trigger = {{ every = "1 epoch" }}
        """) + toml)
    stream = [(f"{e} epochs", "val/loss", v) for e, v in enumerate(values, 1)]
    plan = plan_spec(spec, stream)
    if not t.stopped:
        assert plan.stopped is None
        return
    assert plan.stopped is not None and f"(step {t.clock.step})" in plan.stopped
    why = (t.stopped.reason if t.stopped else "").split(": ", 1)[1]
    assert plan.stopped.endswith(why)
