"""Loop overhead: schedtrain with 0/10/100 callbacks vs a bare torch loop, Ignite and Lightning.

Every variant does the same work: a tiny linear model (16 -> 1, MSE, SGD), batches of
32 on the CPU with one thread, ``--steps`` optimizer steps in epochs of 1000 steps;
each callback fires every 1000 steps and does nothing. Reports the minimum wall time
of ``--repeats`` interleaved runs (and the median's ratio) against the bare loop.

Reproduce (from the repository root)::

    python benchmarks/bench_loop.py --steps 5000 --repeats 7

Ignite and Lightning are optional (the ``bench`` extra); missing ones are skipped.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings
from collections.abc import Callable

import structlog
import torch

from schedtrain import Schedule, every
from schedtrain.callbacks import Callback
from schedtrain.training import Trainer

BATCH, FEATURES, EPOCH = 32, 16, 1000


def _data(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(EPOCH, BATCH, FEATURES, generator=g)
    y = torch.randn(EPOCH, BATCH, 1, generator=g)
    return [(x[i], y[i]) for i in range(min(steps, EPOCH))]


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def bare(steps: int) -> None:
    """A hand-written loop: forward, backward, step, zero_grad."""
    data = _data(steps)
    model, opt = _model()
    loss_fn = torch.nn.functional.mse_loss
    done = 0
    while done < steps:
        for x, y in data:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            done += 1
            if done == steps:
                break


class _Nothing(Callback):
    pass


def schedtrain_loop(n_callbacks: int) -> Callable[[int], None]:
    """schedtrain's Trainer with ``n_callbacks`` callbacks firing every 1000 steps."""
    def run(steps: int) -> None:
        model, opt = _model()
        names = {f"cb{i}": every("1000 steps") for i in range(n_callbacks)}
        trainer = Trainer(model, opt, _data(steps), torch.nn.functional.mse_loss,
                          schedule=Schedule(names), bindings={n: _Nothing() for n in names},
                          max_steps=steps, device="cpu")
        trainer.fit()
    return run


def ignite_loop(n_callbacks: int) -> Callable[[int], None] | None:
    """Ignite's Engine with ``n_callbacks`` handlers on ITERATION_COMPLETED(every=1000)."""
    try:
        from ignite.engine import Engine, Events
    except ImportError:
        return None

    def run(steps: int) -> None:
        model, opt = _model()
        loss_fn = torch.nn.functional.mse_loss

        def update(_engine: object, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            x, y = batch
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        engine = Engine(update)
        for _ in range(n_callbacks):
            engine.add_event_handler(Events.ITERATION_COMPLETED(every=1000), lambda e: None)
        data = _data(steps)
        engine.run(data, max_epochs=-(-steps // len(data)))
    return run


class _Batches:
    """An iterable of batches (Lightning reads a bare list as several data loaders)."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def lightning_loop(n_callbacks: int) -> Callable[[int], None] | None:
    """Lightning's Trainer (no logger, checkpointing or bar) with callbacks checking the step."""
    try:
        import lightning as L
    except ImportError:
        return None

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model, _ = _model()

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor],
                          _idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.model(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Every1000(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *_: object) -> None:
            if trainer.global_step % 1000 == 0:
                pass

    def run(steps: int) -> None:
        trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False,
                            callbacks=[Every1000() for _ in range(n_callbacks)])
        trainer.fit(Module(), train_dataloaders=_Batches(_data(steps)))
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-frameworks", action="store_true",
                        help="skip Ignite and Lightning (Lightning alone takes ~25 s a run)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    variants: dict[str, Callable[[int], None] | None] = {
        "bare torch loop": bare,
        "schedtrain, 0 callbacks": schedtrain_loop(0),
        "schedtrain, 10 callbacks": schedtrain_loop(10),
        "schedtrain, 100 callbacks": schedtrain_loop(100),
        "ignite, 100 handlers": ignite_loop(100),
        "lightning, 100 callbacks": lightning_loop(100),
    }
    if args.no_frameworks:
        variants = {k: v for k, v in variants.items() if not k.startswith(("ignite", "light"))}
    runs = {k: v for k, v in variants.items() if v is not None}
    for fn in runs.values():  # warm up imports and allocator
        fn(200)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():  # interleaved: drift on a shared machine hits all alike
            t0 = time.perf_counter()
            fn(args.steps)
            times[name].append(time.perf_counter() - t0)
    # The minimum is the least disturbed run (as timeit advises); the median shows the spread.
    base_min = min(times["bare torch loop"])
    base_med = statistics.median(times["bare torch loop"])
    print(f"{args.steps} steps, {args.repeats} interleaved repeats, torch {torch.__version__}, "
          "1 thread")
    print(f"{'variant':<28}{'min s':>8}{'us/step':>9}{'vs bare':>9}{'median':>9}")
    for name, ts in times.items():
        lo, med = min(ts), statistics.median(ts)
        print(f"{name:<28}{lo:>8.3f}{lo / args.steps * 1e6:>9.1f}{lo / base_min:>8.3f}x"
              f"{med / base_med:>8.3f}x")
    print("reproduce: python benchmarks/bench_loop.py "
          f"--steps {args.steps} --repeats {args.repeats}")


if __name__ == "__main__":
    main()
