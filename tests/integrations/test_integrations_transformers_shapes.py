"""Hugging Face ``Trainer`` on the shapes ``simulate()`` models with ``batches_per_epoch``
and per-batch lists: an epoch that ends on a partial accumulation step (HF steps on the
epoch's last batch when fewer than ``gradient_accumulation_steps`` remain) and an uneven
last batch (the dataset's rows not a multiple of the batch size, so the last micro-batch
adds fewer tokens). The firings inside real runs equal ``simulate()``'s."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from host_strategies import counters, host_schedules
from test_integrations_transformers import SEQ, dataset, model
from transformers import Trainer, TrainingArguments

from schedtrain import Schedule, ScheduleWarning, Unit, every, simulate
from schedtrain.integrations.transformers import ScheduleCallback

UNITS = [Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.TOKEN]
quiet = pytest.mark.filterwarnings("ignore")

Shape = tuple[int, int, int, int, int]
"""Epochs, micro-batches per epoch, micro-batches per step, rows per batch, rows in the
epoch's last batch."""


def fired(tmp: Path, schedule: Schedule, shape: Shape) -> list[tuple[object, ...]]:
    """The firings inside a real HF run of ``shape``."""
    epochs, batches, accum, rows, last = shape
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        cb = ScheduleCallback(schedule, record=True)
    args = TrainingArguments(
        output_dir=str(tmp), use_cpu=True, report_to="none", disable_tqdm=True,
        per_device_train_batch_size=rows, gradient_accumulation_steps=accum,
        num_train_epochs=epochs, logging_strategy="no", eval_strategy="no",
        save_strategy="no", include_num_input_tokens_seen=True, seed=0)
    Trainer(model=model(), args=args, train_dataset=dataset((batches - 1) * rows + last),
            callbacks=[cb]).train()
    return counters(cb.firings)


def simulated(schedule: Schedule, shape: Shape) -> list[tuple[object, ...]]:
    epochs, batches, accum, rows, last = shape
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        log = simulate(schedule, epochs=epochs, batches_per_epoch=batches,
                       batches_per_step=accum,
                       tokens_per_batch=[rows * SEQ] * (batches - 1) + [last * SEQ])
    return counters(log)


@st.composite
def uneven_shapes(draw: st.DrawFn) -> Shape:
    rows = draw(st.integers(1, 3))
    return (draw(st.integers(1, 2)), draw(st.integers(1, 7)), draw(st.integers(1, 3)), rows,
            draw(st.integers(1, rows)))


@quiet
class TestUnevenShapes:
    def test_the_counter_tables_example(self, tmp_path: Path) -> None:
        """10 batches, 3 a step: steps of 3, 3, 3 and 1 batches; 38 rows in batches of 4:
        the last adds 2 rows' tokens. Every batch, step and 5 tokens' crossing is where
        simulate() puts it."""
        schedule = Schedule({"b": every("1 batch"), "s": every("1 step"),
                             "t": every("20 tokens"), "e": every("1 epoch")})
        shape = (2, 10, 3, 4, 2)
        got = fired(tmp_path, schedule, shape)
        assert [f[2] for f in got if f[:2] == ("s", "step_end")] == list(range(1, 9))
        assert [f[3] for f in got if f[:2] == ("s", "step_end")] == [3, 6, 9, 10, 13, 16,
                                                                      19, 20]
        assert got == simulated(schedule, shape)

    @settings(max_examples=6, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(schedule=host_schedules(UNITS), shape=uneven_shapes())
    def test_firings_equal_simulation(self, schedule: Schedule, shape: Shape,
                                      tmp_path: Path) -> None:
        """Random step, batch, epoch and token triggers over random partial steps and
        uneven last batches: batch_end, step_end and epoch_end firings, with HF's
        counters at each, are simulate()'s."""
        assert fired(tmp_path, schedule, shape) == simulated(schedule, shape)
