"""Per-step cost of schedtrain's host integrations against each host's own cadence flags.

In each host the same training runs three ways, in the same process, alternately:

* **bare** - no cadence at all (the host's loop alone);
* **flags** - the host's own cadence does the work every ``--every`` steps;
* **schedtrain** - the host's cadence off, a schedtrain schedule asks for the same work
  at the same steps.

Hosts and their flags:

* **Lightning** - a no-op ``on_train_batch_end`` callback testing ``global_step % k``, as
  Lightning's own ``every_n_train_steps`` (ModelCheckpoint) does, vs ``ScheduleCallback``
  with a function bound to ``every(k, "steps")``; a linear model, batches of 32;
* **Hugging Face** - ``logging_strategy="steps", logging_steps=k`` vs
  ``ScheduleCallback({"log": every(k steps)}, {"log": "log"})`` (both log the loss every
  k steps); a one-layer GPT-2 built from a config;
* **Ignite** - a no-op handler on ``Events.ITERATION_COMPLETED(every=k)`` vs
  ``attach_schedule`` (a no-op action), vs ``trigger_event(every(k, "steps"))`` and vs
  ``attach_schedule`` running a no-op schedtrain ``Callback``.

Printed: the minimum over ``--repeats`` rounds of the time per step, each variant's extra
time per step over bare (``flags - bare`` and ``schedtrain - bare``, in microseconds) and
the ratio of whole-run times ``schedtrain / flags``. Host loops cost tens of microseconds
(Ignite) to milliseconds (HF) per step, so the extra per step is what to read; a ratio of
1.00 means no measurable difference.

Reproduce (from the repository root, with the ``lightning``, ``ignite`` and
``transformers`` extras)::

    python benchmarks/bench_integrations.py --repeats 5
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from schedtrain import Schedule, every

Variant = Callable[[], None]


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "accelerate",
                 "ignite"):
        logging.getLogger(name).setLevel(logging.ERROR)


# -- Lightning ---------------------------------------------------------------------------
def lightning_variants(steps: int, k: int) -> dict[str, Variant]:
    import lightning.pytorch as pl

    from schedtrain.integrations.lightning import ScheduleCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(16, 1)

        def training_step(self, batch: torch.Tensor, _: int) -> torch.Tensor:
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class EveryK(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
            if trainer.global_step % k == 0:
                pass

    data = torch.utils.data.DataLoader(torch.randn(steps * 32, 16), batch_size=32)

    def fit(callbacks: list[pl.Callback]) -> Variant:
        def run() -> None:
            pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                       enable_progress_bar=False, enable_model_summary=False,
                       accelerator="cpu", callbacks=callbacks).fit(Module(), data)
        return run

    return {
        "bare": fit([]),
        "flags": fit([EveryK()]),
        # a new callback per run: a schedule belongs to one run
        "schedtrain": lambda: fit([ScheduleCallback(  # noqa: PLW0108
            Schedule({"noop": every(k, "steps")}), {"noop": lambda tr, m: None})])(),
    }


# -- Hugging Face --------------------------------------------------------------------------
def hf_variants(steps: int, k: int) -> dict[str, Variant]:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging

    from schedtrain.integrations.transformers import ScheduleCallback

    hf_logging.set_verbosity_error()
    rows = [{"input_ids": r, "labels": r} for r in torch.randint(0, 16, (steps, 8))]
    out = tempfile.mkdtemp()

    def train(logging_steps: int | None, callbacks: list[Any]) -> Variant:
        def run() -> None:
            model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=16,
                                               n_positions=8, bos_token_id=0, eos_token_id=0))
            args = TrainingArguments(
                output_dir=out, use_cpu=True, report_to="none", disable_tqdm=True,
                per_device_train_batch_size=1, num_train_epochs=1, save_strategy="no",
                eval_strategy="no", logging_strategy="steps" if logging_steps else "no",
                logging_steps=logging_steps or 500, log_level="error")
            trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=callbacks)
            trainer.remove_callback(PrinterCallback)  # no printing of each log in the timing
            trainer.train()
        return run

    return {
        "bare": train(None, []),
        "flags": train(k, []),
        "schedtrain": lambda: train(None, [ScheduleCallback(  # noqa: PLW0108
            Schedule({"log": every(k, "steps")}), {"log": "log"})])(),
    }


# -- Ignite ----------------------------------------------------------------------------------
def ignite_variants(steps: int, k: int) -> dict[str, Variant]:
    from ignite.engine import Engine, Events

    from schedtrain.callbacks import Callback
    from schedtrain.integrations.ignite import attach_schedule, trigger_event

    class Noop(Callback):
        """A schedtrain callback whose _trigger does nothing (run by CallbackDriver)."""

        def _trigger(self) -> None:
            return None

    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [torch.randn(32, 16) for _ in range(steps)]

    def step(_: Engine, batch: torch.Tensor) -> float:
        opt.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        opt.step()
        return 0.0

    def run_with(setup: Callable[[Engine], None]) -> Variant:
        def run() -> None:
            engine = Engine(step)
            setup(engine)
            engine.run(data, max_epochs=1)
        return run

    return {
        "bare": run_with(lambda e: None),
        "flags": run_with(lambda e: e.add_event_handler(
            Events.ITERATION_COMPLETED(every=k), lambda _: None)),
        "schedtrain": run_with(lambda e: attach_schedule(
            e, Schedule({"noop": every(k, "steps")}), {"noop": lambda _: None}) and None),
        "schedtrain filter": run_with(lambda e: e.add_event_handler(
            trigger_event(every(k, "steps")), lambda _: None)),
        "schedtrain callback": run_with(lambda e: attach_schedule(
            e, Schedule({"noop": every(k, "steps")}), {"noop": Noop()}) and None),
    }


def measure(variants: dict[str, Variant], repeats: int) -> dict[str, float]:
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(repeats):
        for name, run in variants.items():  # alternately, so drift hits all alike
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--every", type=int, default=50, help="cadence k, in steps")
    parser.add_argument("--hosts", default="lightning,transformers,ignite")
    args = parser.parse_args()
    _quiet()
    torch.set_num_threads(1)
    plan = {"lightning": (lightning_variants, 2000), "transformers": (hf_variants, 300),
            "ignite": (ignite_variants, 5000)}
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, every {args.every} steps, "
          f"min of {args.repeats} rounds")
    print(f"{'host':<13}{'steps':>6}{'bare/step':>12}{'flags - bare':>14}"
          f"{'schedtrain - bare':>19}{'schedtrain / flags':>20}")
    for host in args.hosts.split(","):
        make, steps = plan[host]
        best = measure(make(steps, args.every), args.repeats)
        bare = best["bare"]
        for name in [n for n in best if n.startswith("schedtrain")]:
            print(f"{host:<13}{steps:>6}{bare / steps * 1e6:>10.1f}us"
                  f"{(best['flags'] - bare) / steps * 1e6:>12.2f}us"
                  f"{(best[name] - bare) / steps * 1e6:>17.2f}us"
                  f"{best[name] / best['flags']:>19.3f}x"
                  + ("" if name == "schedtrain" else f"   ({name})"))


if __name__ == "__main__":
    main()
