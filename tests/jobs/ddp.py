"""A small classification job for runs on several processes (tests/distributed/test_distributed.py),
with callbacks that behave differently per rank."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.callbacks import Callback, ModelSaver
from schedtrain.training import Task


def make_task(momentum: float = 0.0) -> Task:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    return Task(model=model, optimizer=optimizer,
                train_data=DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
                val_data=DataLoader(TensorDataset(x[:64], y[:64]), batch_size=16),
                loss_fn=torch.nn.functional.cross_entropy)


def make_scaled_task() -> Task:
    """The job with 128 samples per rank: 8 steps per epoch on any number of ranks."""
    import os

    n = 128 * int(os.environ.get("WORLD_SIZE", "1"))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    task = make_task()
    return Task(model=task.model, optimizer=task.optimizer,
                train_data=DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
                val_data=task.val_data, loss_fn=task.loss_fn)


def make_sized_task() -> Task:
    """The job over ``SIZED_TASK="samples,batch,drop_last"`` samples (default
    ``250,10,0``): epochs whose samples divide unevenly among ranks and into batches."""
    import os

    size, batch, drop = (int(x) for x in os.environ.get("SIZED_TASK", "250,10,0").split(","))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, 8, generator=g)
    y = (x[:, 0] > 0).long()
    task = make_task()
    return Task(model=task.model, optimizer=task.optimizer,
                train_data=DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True,
                                      drop_last=bool(drop)),
                val_data=None, loss_fn=task.loss_fn)


def make_momentum_task() -> Task:
    """The same job with an optimizer that has state (momentum) to checkpoint."""
    return make_task(momentum=0.9)


def make_slow_save_task() -> Task:
    """The momentum job whose sharded checkpoint writes take 0.2 s longer (in DCP's
    thread): a save every step finds the previous one still in flight."""
    import time

    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    original = FileSystemWriter.write_data

    def slow(self: FileSystemWriter, *args: object, **kwargs: object) -> object:
        time.sleep(0.2)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    FileSystemWriter.write_data = slow  # type: ignore[method-assign,assignment]
    return make_momentum_task()


class _NaNOnRank:
    """Cross-entropy whose loss is NaN on one rank at one step (the step's one batch)."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step, self.calls = rank, step, 0

    def __call__(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = torch.nn.functional.cross_entropy(out, target)
        bad = self.calls == self.step and torch.distributed.get_rank() == self.rank
        return loss * float("nan") if bad else loss


def make_nan_task() -> Task:
    """The job with a NaN loss on rank 1 at step 5 only (DDP spreads it from step 6)."""
    task = make_task()
    return Task(model=task.model, optimizer=task.optimizer, train_data=task.train_data,
                val_data=task.val_data, loss_fn=_NaNOnRank(1, 5))


def _nan_in_eval_on_rank_1(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    loss = torch.nn.functional.cross_entropy(out, target)
    bad = torch.is_inference_mode_enabled() and torch.distributed.get_rank() == 1
    return loss * float("nan") if bad else loss


def make_nan_eval_task() -> Task:
    """The job whose validation loss is NaN on rank 1 only (training is finite)."""
    task = make_task()
    return Task(model=task.model, optimizer=task.optimizer, train_data=task.train_data,
                val_data=task.val_data, loss_fn=_nan_in_eval_on_rank_1)


class RankMetric(Callback):
    """Puts ``rank/value``: the rank itself, so its mean differs from every rank's own."""

    produces = ("rank/value",)

    def _trigger(self) -> None:
        self.metrics.put("rank/value", float(self.rank))


class StopOnRank(Callback):
    """Asks to stop on one rank only (the others must stop at the same step)."""

    def __init__(self, rank: int = 1, step: int = 6) -> None:
        self.stop_rank, self.stop_step = rank, step

    def _trigger(self) -> None:
        if self.rank == self.stop_rank and self.now.step >= self.stop_step:
            self.trainer.request_stop(f"rank {self.rank} asked at step {self.now.step}")


class SignalOnRank(StopOnRank):
    """Sends SIGTERM to its own process on one rank, once, at its first firing at or
    after ``step``: a preemption that reaches one rank only."""

    may_stop_alone = False  # the signal preempts; the callback never asks to stop

    def _trigger(self) -> None:
        import os
        import signal

        due = self.rank == self.stop_rank and self.now.step >= self.stop_step
        if due and not getattr(self, "sent", False):
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


class FailOnRank(Callback):
    """Raises on one rank at one step (the other must end quickly, not hang)."""

    def __init__(self, rank: int = 1, step: int = 5) -> None:
        self.fail_rank, self.fail_step = rank, step

    def _trigger(self) -> None:
        if self.rank == self.fail_rank and self.now.step == self.fail_step:
            raise RuntimeError(f"deliberate failure on rank {self.rank}")


class KillNode(Callback):
    """``kill -9`` of this rank's whole node (its torchrun agent, then itself) at the end
    of one step, when ``SCHEDTRAIN_TEST_KILL`` = ``"RANK:STEP"`` names this rank: a lost
    node timed off the training's own steps, not off a clock. Unset: does nothing."""

    def _trigger(self) -> None:
        import os
        import signal

        rank, _, step = os.environ.get("SCHEDTRAIN_TEST_KILL", "").partition(":")
        if step and self.rank == int(rank) and self.now.step == int(step):
            os.kill(os.getppid(), signal.SIGKILL)  # the agent first: it must not restart us
            os.kill(os.getpid(), signal.SIGKILL)


class DumpFirings(Callback):
    """At train end, writes this rank's firings to ``RUN_DIR/../firings-rankN.json``."""

    def _trigger(self) -> None:
        import json

        assert self.trainer.run_dir is not None
        out = self.trainer.run_dir.parent / f"firings-rank{self.rank}.json"
        out.write_text(json.dumps([[f.callback, f.event, f.timestamp.step, f.timestamp.sample]
                                   for f in self.trainer.firings]))


class Sleep(Callback):
    """Slows every step down, so a signal can land while training runs."""

    def __init__(self, seconds: float = 0.1) -> None:
        self.seconds = seconds

    def _trigger(self) -> None:
        import time

        time.sleep(self.seconds)


class DumpWeights(Callback):
    """Writes the full model and optimizer states (gathered from the shards under FSDP2)
    to ``RUN_DIR/../weights-<world size>.pt`` (on the chief)."""

    def _trigger(self) -> None:
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        full = StateDictOptions(full_state_dict=True)
        model, optim = get_state_dict(self.trainer.model, self.trainer.optimizer,
                                      options=full)
        if self.is_chief:
            assert self.trainer.run_dir is not None
            size = dist.get_world_size() if dist.is_initialized() else 1
            out = self.trainer.run_dir.parent / f"weights-{size}.pt"
            torch.save({"model": model, "optimizer": optim}, out)


class Quiet(Callback):
    """Does nothing, and says it never stops alone: its firings need no stop flag."""

    may_stop_alone = False

    def _trigger(self) -> None:
        pass


class MayStop(Callback):
    """Does nothing, but could ask to stop from this rank's state (the default)."""

    def _trigger(self) -> None:
        pass


_COLLECTIVES = ("all_gather", "all_reduce", "broadcast", "broadcast_object_list",
                "all_gather_object", "gather_object", "barrier", "reduce", "gather",
                "scatter", "all_to_all", "reduce_scatter", "all_gather_into_tensor",
                "reduce_scatter_tensor", "scatter_object_list")
#: where a collective's own input is among its positional arguments (the rest: first)
_INPUT_AT = {"all_gather": 1, "all_gather_into_tensor": 1, "reduce_scatter": 1,
             "reduce_scatter_tensor": 1, "all_to_all": 1, "all_gather_object": 1}
_STORE_OPS = ("check", "get", "set", "compare_set", "add")


def payload(name: str, args: tuple[object, ...], kwargs: dict[str, object]) -> int:
    """The bytes this rank puts into collective ``name``: a tensor's (or a list's) size,
    an object's pickled size (what the ``*_object*`` collectives send, besides an 8-byte
    length), nothing for a barrier."""
    import pickle

    if name == "barrier":
        return 0
    at = _INPUT_AT.get(name, 0)  # scatter_object_list: the output, this rank's part
    value = args[at] if len(args) > at else next(iter(kwargs.values()), None)
    if name.endswith(("_object", "_object_list")):
        return len(pickle.dumps(value))
    tensors = value if isinstance(value, list | tuple) else [value]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class CountCollectives(Callback):
    """Records the collectives called through ``torch.distributed`` (DDP's own gradient
    all-reduce runs in C++, outside it) and the process group store's requests
    (``store:check`` ...; not collectives) from setup on, each as ``[name, bytes]``
    (``payload``), with ``["fired", event]`` at each of its firings. After every record
    the list goes to ``RUN_DIR/../collectives-rankN.json``, so what follows its last
    firing (a preemption checkpoint) is there too."""

    may_stop_alone = False

    def _setup(self) -> None:
        import torch.distributed as dist

        self.calls: list[list[object]] = []
        for name in _COLLECTIVES:
            original = getattr(dist, name, None)
            if original is None:
                continue
            # A rank forked from a test process inherits its patches: one that counts or
            # calls more would pass as this run's own collectives.
            if not getattr(original, "__module__", "").startswith("torch."):
                raise RuntimeError(f"torch.distributed.{name} is not torch's own, but "
                                   f"{original!r}: this rank's count would not be its own")
            setattr(dist, name, self._counted(name, original))
        comm = self.trainer.comm
        if comm is not None:
            store = comm._store

            class Counted:  # the C++ store's methods cannot be replaced on it
                def __getattr__(_, attr: str) -> object:
                    got = getattr(store, attr)
                    return self._counted(f"store:{attr}", got) if attr in _STORE_OPS else got

            comm._store = Counted()

    def _counted(self, name: str, original: object) -> object:
        def call(*args: object, **kwargs: object) -> object:
            out = original(*args, **kwargs)  # type: ignore[operator]
            sent = 0 if name.startswith("store:") else payload(name, args, kwargs)
            self._record([name, sent])
            return out
        return call

    def _record(self, row: list[object]) -> None:
        import json

        self.calls.append(row)
        assert self.trainer.run_dir is not None
        out = self.trainer.run_dir.parent / f"collectives-rank{self.rank}.json"
        out.write_text(json.dumps(self.calls))

    def _trigger(self) -> None:
        self._record(["fired", self.now.step])


def collective_count(calls: list[list[object]]) -> int:
    """How many collectives ``CountCollectives`` recorded (not the store's requests)."""
    return sum(1 for name, _ in calls if name != "fired" and not str(name).startswith("store:"))


class RaiseStopOnRank(StopOnRank):
    """Raises ``StopTraining`` on one rank only, instead of asking."""

    def _trigger(self) -> None:
        from schedtrain.errors import StopTraining

        if self.rank == self.stop_rank and self.now.step >= self.stop_step:
            raise StopTraining(f"rank {self.rank} raised at step {self.now.step}")


class RaiseStopInHookOnRank(StopOnRank):
    """Raises ``StopTraining`` from its ``after_step`` hook on one rank only."""

    def _after_step(self, step: int, outputs: object) -> None:  # type: ignore[override]
        from schedtrain.errors import StopTraining

        if self.rank == self.stop_rank and step == self.stop_step:
            raise StopTraining(f"rank {self.rank}'s hook raised at step {step}")


class StepClockSaver(ModelSaver):
    """A ``ModelSaver`` whose ``every("auto")`` measurements read a clock of steps: one
    second a step, and each landing adds ``cost`` seconds (times the rank plus one, so
    the ranks measure differently and only agreeing on the chief's keeps them together).
    The decisions are the same in every run, killed and resumed or not."""

    def __init__(self, cost: float = 1.0, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.cost, self._offset = cost, 0.0

    def _cost(self) -> float:
        return self.cost * (1 + self.now.step * 7 % 5 / 4) * (1 + self.rank)

    def _setup(self) -> None:
        super()._setup()
        assert self._pacing is not None
        self._pacing.clock = lambda: self.now.step + self._offset

    def _landed(self, written: object) -> None:
        self._offset += self._cost()
        super()._landed(written)  # type: ignore[arg-type]
