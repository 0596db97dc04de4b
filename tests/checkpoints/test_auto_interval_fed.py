"""``every("auto")`` runs only where something feeds it the cost of each save: bound to a
callback that measures none, or run under a host, it would stay at its first step for the
whole run, so it is refused before training with a line naming the callback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_helpers import Noop, UnevenData, tiny_model

from schedtrain import Schedule, at, every, on
from schedtrain.callbacks import MaxSaver, MinSaver, ModelSaver, TopKSaver
from schedtrain.errors import ScheduleError
from schedtrain.triggers import Trigger, auto_every


def _with_auto(draw: st.DrawFn) -> Trigger:
    """A trigger with an ``every("auto")`` somewhere in it."""
    auto: Trigger = auto_every(draw(st.integers(1, 20)))
    for _ in range(draw(st.integers(0, 2))):
        other = draw(st.sampled_from([on("train_end"), every(7, "steps"), at("5 steps")]))
        auto = draw(st.sampled_from([auto | other, other | auto, auto & ~at("3 steps")]))
    return auto


with_auto = st.composite(_with_auto)

#: Callbacks that make no save they measure (a function, a plain callback, savers
#: ranked by a metric).
NOT_MEASURING = [lambda: (lambda trainer: None), Noop, lambda: MinSaver("loss"),
                 lambda: MaxSaver("loss"), lambda: TopKSaver("loss", save_top_k=2)]


def _trainer(run_dir: Path, trigger: Trigger, callback: Any) -> Any:
    from schedtrain.training import Trainer
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([30]), torch.nn.functional.mse_loss,
                   schedule=Schedule({"cb": trigger}), bindings={"cb": callback},
                   device="cpu", run_dir=run_dir, handle_signals=False, max_epochs=1,
                   mtbf="1 h")


@settings(max_examples=25, deadline=None)
@given(with_auto(), st.sampled_from(NOT_MEASURING))
def test_auto_on_a_callback_that_measures_no_save_is_refused(
        tmp_path_factory: pytest.TempPathFactory, trigger: Trigger, make: Any) -> None:
    callback = make()
    with pytest.raises(ScheduleError, match=r"callbacks\.cb: every\('auto'\) picks a "
                                            r"checkpoint interval .* measures none"):
        _trainer(tmp_path_factory.mktemp("r"), trigger, callback)


class _MySaver(ModelSaver):
    """A user's saver: a ModelSaver's measurements come with it."""


@settings(max_examples=6, deadline=None)
@given(with_auto(), st.sampled_from([ModelSaver, _MySaver]))
def test_auto_on_a_model_saver_or_a_subclass_is_accepted_and_fed(
        tmp_path_factory: pytest.TempPathFactory, trigger: Trigger, kind: type) -> None:
    tmp = tmp_path_factory.mktemp("r")
    t = _trainer(tmp, trigger, kind(keep=None))
    t.fit()
    intervals = [r for r in _events(tmp) if r.get("name") == "cb/interval"]
    saves = [f for f in t.firings if f.callback == "cb"]
    assert saves and len(intervals) >= 1  # its saves were measured and decided on


def _events(run_dir: Path) -> list[dict[str, Any]]:
    import json
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def _plain(schedule: Schedule) -> Any:
    from schedtrain.integrations import ScheduleDriver
    return ScheduleDriver(schedule, actions={"cb": lambda: None})


def _lightning(schedule: Schedule) -> Any:
    from schedtrain.integrations.lightning import ScheduleCallback
    return ScheduleCallback(schedule, {"cb": "checkpoint"})


def _transformers(schedule: Schedule) -> Any:
    from schedtrain.integrations.transformers import ScheduleCallback
    return ScheduleCallback(schedule, {"cb": lambda args, state, control, **kw: None})


def _ignite(schedule: Schedule) -> Any:
    from ignite.engine import Engine

    from schedtrain.integrations.ignite import attach_schedule
    return attach_schedule(Engine(lambda e, b: None), schedule, {"cb": lambda engine: None})


@pytest.mark.parametrize("host", [_plain, _lightning, _transformers, _ignite],
                         ids=["driver", "lightning", "transformers", "ignite"])
@settings(max_examples=5, deadline=None)
@given(trigger=with_auto())
def test_auto_under_a_host_is_refused(host: Any, trigger: Trigger) -> None:
    """A host's own save is not measured: the interval would never be decided."""
    with pytest.raises(ValueError, match=r"callback 'cb': every\('auto'\) paces saves by "
                                         r"their measured cost, and .*: give the interval"):
        host(Schedule({"cb": trigger}))
