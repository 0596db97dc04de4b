"""One schedule inside each host on several processes
(tests/integrations/test_integrations_ranks.py).

Run as ``torchrun --standalone --nproc-per-node 2 tests/jobs/hosts.py HOST OUT``: every
rank trains with ``SCHEDULE`` in ``HOST`` (lightning, transformers, ignite, driver, or
driver-steps: the driver with a clock-only schedule and a condition) and writes
``OUT/rank{r}.json``: its firings (``counters``) and the collectives its agreement ran.

What differs per rank: each rank's wall clock runs at its own rate (``ticker``), the
metric ``m`` each rank logs (``value``), and (Lightning, Ignite, the driver) the rows in
a batch (``ROWS``). The test simulates the same run with ``simulate_ranks``.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from schedtrain import Schedule, every, on, when
from tests.host_strategies import counters

EPOCHS, STEPS = 2, 6
ROWS = (2, 3)  # rows per batch on rank 0 and rank 1
STEP_NS = 100_000_000  # the chief's clock: 0.1 s per step
RANK1_STEP_NS = 170_000_000  # rank 1's


def schedule(kind: str, metric: str = "m", samples: bool = True) -> Schedule:
    """``full``: a clock part, a condition on ``metric``, a time trigger and (``samples``)
    a trigger on samples; ``steps``: a clock part and a condition on steps only."""
    if kind == "steps":
        return Schedule({"clock": every("4 steps") | on("train_end"),
                         "cond": every("3 steps") & when(f"{metric} > 2")})
    triggers = {"clock": every("4 steps") | every("1 epoch") | on("train_end"),
                "cond": every("1 step") & when(f"{metric} > 2"),
                "timed": every("0.25 s")}
    if samples:
        triggers["samples"] = every("12 samples")
    return Schedule(triggers)


def value(rank: int, n: int) -> float:
    """What rank ``rank`` logs as ``m`` in its ``n``-th training step (from 0)."""
    return float(n % 5) if rank == 0 else float((2 * n + 1) % 7)


def ticker(rank: int) -> Callable[[], int]:
    """A wall clock: rank 0's moves 0.1 s per reading (one a step), rank 1's 0.17 s."""
    count = itertools.count()
    rate = STEP_NS if rank == 0 else RANK1_STEP_NS
    return lambda: next(count) * rate


def _lightning(rank: int, schedule: Schedule) -> tuple[list[Any], int]:
    import lightning.pytorch as pl

    from schedtrain.integrations.lightning import ScheduleCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)
            self.n = 0

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            self.log("m", value(rank, self.n), on_step=True)  # not synced: reduced
            self.n += 1
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    cb = ScheduleCallback(schedule, record=True, time_source=ticker(rank))
    data = torch.utils.data.DataLoader(torch.zeros(STEPS * ROWS[rank], 3),
                                       batch_size=ROWS[rank])
    pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS,
               logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0,
               use_distributed_sampler=False, callbacks=[cb]).fit(Module(), data)
    assert cb.driver.ranks is not None
    return cb.firings, cb.driver.ranks.collectives


def _transformers(rank: int, schedule: Schedule) -> tuple[list[Any], int]:
    from transformers import Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    from schedtrain.integrations.transformers import ScheduleCallback

    hf_logging.set_verbosity_error()

    class Model(torch.nn.Module):
        """Its loss is what the rank logs: HF logs the mean over ranks as ``loss``."""

        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.n = 0

        def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None
                    ) -> dict[str, torch.Tensor]:
            loss = self.w.sum() * 0 + value(rank, self.n)
            self.n += 1
            return {"loss": loss}

    args = TrainingArguments(
        output_dir=str(Path(sys.argv[2]) / "hf"), use_cpu=True, report_to="none",
        disable_tqdm=True, per_device_train_batch_size=1, num_train_epochs=EPOCHS,
        eval_strategy="no", save_strategy="no", logging_strategy="steps", logging_steps=1,
        ddp_backend="gloo", log_level="error", dataloader_drop_last=True)
    rows = [{"x": torch.zeros(1)} for _ in range(2 * STEPS)]  # STEPS per rank and epoch
    cb = ScheduleCallback(schedule, record=True, time_source=ticker(rank))
    Trainer(model=Model(), args=args, train_dataset=rows, callbacks=[cb]).train()
    assert cb.driver.ranks is not None
    return cb.firings, cb.driver.ranks.collectives


def _ignite(rank: int, schedule: Schedule) -> tuple[list[Any], int]:
    import ignite.distributed as idist
    from ignite.engine import Engine

    from schedtrain.integrations.ignite import attach_schedule

    out: list[tuple[list[Any], int]] = []

    def run(local_rank: int) -> None:
        engine = Engine(lambda e, batch: value(rank, e.state.iteration - 1))
        handle = attach_schedule(engine, schedule, samples=len, record=True,
                                 metrics=lambda e: {"m": e.state.output},
                                 time_source=ticker(rank))
        engine.run([torch.zeros(ROWS[rank], 3)] * STEPS, max_epochs=EPOCHS)
        assert handle.driver.ranks is not None
        out.append((handle.driver.firings, handle.driver.ranks.collectives))

    with idist.Parallel(backend="gloo") as parallel:
        parallel.run(run)
    return out[0]


def _driver(rank: int, schedule: Schedule) -> tuple[list[Any], int]:
    from schedtrain.integrations import ScheduleDriver

    torch.distributed.init_process_group("gloo")
    driver = ScheduleDriver(schedule, record=True, time_source=ticker(rank))
    driver.train_start()
    n = 0
    for _ in range(EPOCHS):
        driver.epoch_start()
        for _ in range(STEPS):
            driver.put("m", value(rank, n))
            n += 1
            driver.step(samples=ROWS[rank])
        driver.epoch_end()
    driver.train_end()
    assert driver.ranks is not None
    return driver.firings, driver.ranks.collectives


HOSTS = {"lightning": _lightning, "transformers": _transformers, "ignite": _ignite,
         "driver": _driver}


def main() -> None:
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "ignite"):
        logging.getLogger(name).setLevel(logging.ERROR)
    host, out = sys.argv[1], Path(sys.argv[2])
    kind = "steps" if host.endswith("-steps") else "full"
    rank = int(os.environ["RANK"])
    host = host.removesuffix("-steps")
    hf = host == "transformers"  # HF logs the ranks' mean loss as `loss`; counts no samples
    firings, collectives = HOSTS[host](rank, schedule(kind, "loss" if hf else "m", not hf))
    (out / f"rank{rank}.json").write_text(json.dumps(
        {"firings": counters(firings), "collectives": collectives}))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's threads may abort a finished process at interpreter shutdown


if __name__ == "__main__":
    main()
