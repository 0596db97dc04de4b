"""``RunShape`` and ``SimClock``: the clock of a simulated run of known shape.

Counters are functions of the position in the run, so a simulation can move the
clock straight to the next point where anything may fire. Positions are ordered
keys ``(completed steps, phase, sub-position)``; the clock never moves backwards.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from schedtrain.clock import Clock, step_back
from schedtrain.time import Timestamp

__all__ = ["Key", "RunShape", "SimClock"]

#: Position of a point in a run: (completed steps, phase, sub-position).
Key = tuple[int, int, int]
_TRAIN_START: Key = (0, -1, 0)
_PH_BATCH, _PH_STEP, _PH_EPOCH_END, _PH_EPOCH_START, _PH_TRAIN_END = 0, 1, 2, 3, 4


def _ceil_div(d: float, rate: float) -> float:
    """Smallest whole n >= 0 with n * rate >= d (inf when unreachable)."""
    if d <= 0:
        return 0
    if rate <= 0 or math.isinf(d):
        return math.inf
    n = math.ceil(d / rate)
    while n > 0 and (n - 1) * rate >= d:  # float division can overshoot
        n -= 1
    while n * rate < d:
        n += 1
    return n


def _to_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


@attrs.frozen
class RunShape:
    """The shape of a simulated run.

    Args:
        epoch_lengths: optimizer steps in each epoch.
        batches_per_step: micro-batches per optimizer step (gradient accumulation).
        samples_per_batch, tokens_per_batch: what each micro-batch adds to the counters.
        seconds_per_step: training wall time per optimizer step.
        cut_short: the last epoch was cut by ``max_steps``: it starts but does not end
            (no ``epoch_end``), as in the training loop.
    """

    epoch_lengths: tuple[int, ...] = attrs.field(converter=_to_tuple)
    batches_per_step: int = 1
    samples_per_batch: int = 0
    tokens_per_batch: int = 0
    seconds_per_step: float = 0.0
    cut_short: bool = False
    _starts: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        for i, n in enumerate(self.epoch_lengths):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"epoch_lengths[{i}] must be a whole number >= 1, got {n!r}")
        if self.batches_per_step < 1:
            raise ValueError(f"batches_per_step must be >= 1, got {self.batches_per_step!r}")
        if self.samples_per_batch < 0 or self.tokens_per_batch < 0 or self.seconds_per_step < 0:
            raise ValueError("samples_per_batch, tokens_per_batch and seconds_per_step "
                             "must be >= 0")
        starts = [0]
        for n in self.epoch_lengths:
            starts.append(starts[-1] + n)
        object.__setattr__(self, "_starts", tuple(starts))

    @classmethod
    def build(
        cls,
        *,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        epoch_lengths: Sequence[int] | None = None,
        batches_per_step: int = 1,
        samples_per_batch: int = 0,
        tokens_per_batch: int = 0,
        seconds_per_step: float = 0.0,
        max_steps: int | None = None,
    ) -> RunShape:
        """From ``epochs`` and ``steps_per_epoch``, or from ``epoch_lengths``.

        ``max_steps`` ends the run right after that step, as the trainer does: an epoch
        it cuts short has no ``epoch_end``.
        """
        if epoch_lengths is not None:
            if steps_per_epoch is not None:
                raise TypeError("give steps_per_epoch or epoch_lengths, not both")
            lengths = list(epoch_lengths)
            if epochs is not None and epochs != len(lengths):
                raise ValueError(
                    f"epochs={epochs} but epoch_lengths has {len(lengths)} entries")
        else:
            if epochs is None or steps_per_epoch is None:
                raise TypeError("give epochs and steps_per_epoch, or epoch_lengths")
            if epochs < 0:
                raise ValueError(f"epochs must be >= 0, got {epochs}")
            lengths = [steps_per_epoch] * epochs
        cut = False
        if max_steps is not None:
            if max_steps < 1:
                raise ValueError(f"max_steps must be >= 1, got {max_steps}")
            done = 0
            for i, n in enumerate(lengths):
                if done + n >= max_steps:
                    cut = done + n > max_steps
                    lengths = [*lengths[:i], max_steps - done]
                    break
                done += n
        return cls(tuple(lengths), batches_per_step, samples_per_batch, tokens_per_batch,
                   seconds_per_step, cut)

    @property
    def ended_epochs(self) -> int:
        """Epochs that reach their ``epoch_end``."""
        return len(self.epoch_lengths) - (1 if self.cut_short else 0)

    @property
    def epochs(self) -> int:
        """Number of epochs."""
        return len(self.epoch_lengths)

    @property
    def total_steps(self) -> int:
        """Optimizer steps in the whole run."""
        return self._starts[-1]

    def start(self, epoch: int) -> int:
        """Steps completed before ``epoch`` (0-based index) begins."""
        return self._starts[epoch]

    def epoch_of_step(self, step: int) -> int:
        """Index of the epoch that contains global step ``step`` (1-based)."""
        return bisect.bisect_left(self._starts, step) - 1

    def at_steps(self, steps: int, epoch: int, in_epoch: int) -> Timestamp:
        """Counters with ``steps`` steps completed."""
        b = steps * self.batches_per_step
        return Timestamp(steps, b, epoch, in_epoch, b * self.samples_per_batch,
                         b * self.tokens_per_batch, steps * self.seconds_per_step)

    def min_steps(self, counter: str, due: float) -> float:
        """Fewest completed steps at which a step-driven ``counter`` reaches ``due``."""
        b = self.batches_per_step
        rate = {"step": 1, "batch": b, "sample": b * self.samples_per_batch,
                "token": b * self.tokens_per_batch, "seconds": self.seconds_per_step}[counter]
        return _ceil_div(due, rate)


class SimClock(Clock):
    """A clock for a run of known shape; positioned by the simulation, never backwards."""

    def __init__(self, shape: RunShape) -> None:
        self.shape = shape
        self._key: Key = _TRAIN_START
        self._set(Timestamp())
        self._prev_step_end = Timestamp()

    def _set(self, ts: Timestamp) -> None:
        self.step, self.batch, self.epoch = ts.step, ts.batch, ts.epoch
        self.step_in_epoch, self.sample, self.token = ts.step_in_epoch, ts.sample, ts.token
        self.seconds = ts.seconds

    def _move(self, key: Key, ts: Timestamp) -> None:
        if key < self._key:
            raise ValueError(
                f"time can't go backwards: the clock is at {self._key}, asked for {key}")
        self._key = key
        self._set(ts)

    @property
    def key(self) -> Key:
        """Where the clock is in the run's sequence of evaluation points."""
        return self._key

    # -- positioning ----------------------------------------------------------------
    def to_step_end(self, step: int) -> None:
        """Move to the end of global step ``step``."""
        sh = self.shape
        if not 1 <= step <= sh.total_steps:
            raise ValueError(f"step {step} is outside the run (1..{sh.total_steps})")
        e = sh.epoch_of_step(step)
        self._prev_step_end = self._step_end_ts(step - 1)
        self._move((step, _PH_STEP, 0), sh.at_steps(step, e, step - sh.start(e)))

    def _step_end_ts(self, step: int) -> Timestamp:
        if step == 0:
            return Timestamp()
        e = self.shape.epoch_of_step(step)
        return self.shape.at_steps(step, e, step - self.shape.start(e))

    def to_batch_end(self, batch: int) -> None:
        """Move to the end of global micro-batch ``batch``."""
        sh = self.shape
        done = (batch - 1) // sh.batches_per_step
        e = sh.epoch_of_step(done + 1)
        ts = attrs.evolve(sh.at_steps(done, e, done - sh.start(e)), batch=batch,
                          sample=batch * sh.samples_per_batch,
                          token=batch * sh.tokens_per_batch)
        self._move((done + 1, _PH_BATCH, batch), ts)

    def to_epoch_start(self, epoch: int) -> None:
        """Move to the start of epoch ``epoch`` (0-based)."""
        s = self.shape.start(epoch)
        self._move((s, _PH_EPOCH_START, 0), self.shape.at_steps(s, epoch, 0))

    def to_epoch_end(self, epoch: int) -> None:
        """Move to the end of epoch ``epoch`` (0-based): the epoch counter becomes ``epoch + 1``."""
        s = self.shape.start(epoch + 1)
        self._move((s, _PH_EPOCH_END, 0),
                   self.shape.at_steps(s, epoch + 1, self.shape.epoch_lengths[epoch]))

    def to_custom(self, step: int, index: int) -> None:
        """Move to a custom event fired after step ``step``'s end."""
        self._move((step, _PH_STEP, 1 + index), self._step_end_ts(step))

    def to_train_end(self) -> None:
        """Move to the end of training."""
        sh = self.shape
        ts = sh.at_steps(sh.total_steps, sh.ended_epochs,
                         sh.epoch_lengths[-1] if sh.epochs else 0)
        self._move((sh.total_steps, _PH_TRAIN_END, 0), ts)

    def advance(self, steps: int) -> None:
        """Move ``steps`` optimizer steps forward, to a step end."""
        if steps < 0:
            raise ValueError(f"time can't go backwards: advance(steps={steps})")
        self.to_step_end(self.step + steps)

    def advance_epochs(self, epochs: int) -> None:
        """Move to the end of the ``epochs``-th epoch from here (1: the current epoch's end)."""
        if epochs < 1:
            raise ValueError(f"time can't go backwards: advance_epochs({epochs})")
        # Inside an epoch ``epoch`` is its index; at an epoch end it is the next one's.
        target = self.epoch + epochs - 1
        if target >= self.shape.epochs:
            raise ValueError(f"epoch {target + 1} is past the run's {self.shape.epochs} epochs")
        self.to_epoch_end(target)

    # -- the Clock interface ----------------------------------------------------------
    def now(self) -> Timestamp:
        return Timestamp(self.step, self.batch, self.epoch, self.step_in_epoch,
                         self.sample, self.token, self.seconds)

    def previous(self, event: str) -> Timestamp:
        if event == "step_end":
            return self._prev_step_end
        return step_back(self.now(), event)

    def state_dict(self) -> dict[str, Any]:
        return {"key": list(self._key), **super().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._key = (int(state["key"][0]), int(state["key"][1]), int(state["key"][2]))
        self._set(Timestamp(**state["now"]))
        self._prev_step_end = Timestamp(**state["previous_step_end"])


