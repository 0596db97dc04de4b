"""``RunShape`` and ``SimClock``: the clock of a simulated run of known shape.

Counters are functions of the position in the run, so a simulation can move the
clock straight to the next point where anything may fire. Positions are ordered
keys ``(completed steps, phase, sub-position)``; the clock never moves backwards.
A shape stores epochs as runs of equal lengths, so a billion equal epochs cost no
more memory than one.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from typing import Any

import attrs

from schedtrain.clock import Clock, step_back
from schedtrain.time import MAX_COUNT, Timestamp, exact_ns

__all__ = ["Key", "RunShape", "SimClock", "batch_key"]

#: Position of a point in a run: (completed steps, phase, sub-position).
Key = tuple[int, int, int]
TRAIN_START: Key = (0, -1, 0)
PH_BATCH, PH_STEP, PH_EPOCH_END, PH_EPOCH_START, PH_TRAIN_END = 0, 1, 2, 3, 4


def batch_key(batch: int, shape: RunShape, *, start: bool = False) -> Key:
    """The position of micro-batch ``batch``'s end (or start): under ``PH_BATCH`` of the
    step it belongs to, sub-position ``2 * batch`` for its end and one less for its start,
    so each batch's start falls between the previous batch's end and its own."""
    return ((batch - 1) // shape.batches_per_step + 1, PH_BATCH, 2 * batch - start)


def ceil_div(due: float, rate: int) -> float:
    """Smallest whole n >= 0 with n * rate >= due (inf when unreachable)."""
    if due <= 0:
        return 0
    if rate <= 0 or math.isinf(due):
        return math.inf
    d = math.ceil(due)
    return -(-d // rate)


def _whole(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_COUNT:
        raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")
    return value


@attrs.frozen
class RunShape:
    """The shape of a simulated run.

    Args:
        runs: ``(steps per epoch, number of such epochs)`` in order; ``build`` makes them.
        batches_per_step: micro-batches per optimizer step (gradient accumulation).
        samples_per_batch, tokens_per_batch: what each micro-batch adds to the counters.
        ns_per_step: training wall time per optimizer step, in nanoseconds.
        cut_short: the last epoch was cut by ``max_steps``: it starts but does not end
            (no ``epoch_end``), as in the training loop.
    """

    runs: tuple[tuple[int, int], ...]
    batches_per_step: int = 1
    samples_per_batch: int = 0
    tokens_per_batch: int = 0
    ns_per_step: int = 0
    cut_short: bool = False
    _epoch_at: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)
    _step_at: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        for i, (length, count) in enumerate(self.runs):
            _whole(f"epoch_lengths (run {i})", length, 1)
            _whole(f"epochs (run {i})", count, 1)
        _whole("batches_per_step", self.batches_per_step, 1)
        _whole("samples_per_batch", self.samples_per_batch, 0)
        _whole("tokens_per_batch", self.tokens_per_batch, 0)
        _whole("ns_per_step", self.ns_per_step, 0)
        epoch_at, step_at = [0], [0]
        for length, count in self.runs:
            epoch_at.append(epoch_at[-1] + count)
            step_at.append(step_at[-1] + length * count)
        if step_at[-1] * self.batches_per_step > MAX_COUNT:
            raise ValueError(f"a run of {step_at[-1]} steps is longer than this library "
                             f"counts ({MAX_COUNT} batches)")
        object.__setattr__(self, "_epoch_at", tuple(epoch_at))
        object.__setattr__(self, "_step_at", tuple(step_at))

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

        ``seconds_per_step`` is read exactly as written (``0.35`` is 350,000,000 ns).
        ``max_steps`` ends the run right after that step, as the trainer does: an epoch
        it cuts short has no ``epoch_end``.
        """
        if epoch_lengths is not None:
            if steps_per_epoch is not None:
                raise TypeError("give steps_per_epoch or epoch_lengths, not both")
            lengths = [_whole(f"epoch_lengths[{i}]", n, 1) for i, n in enumerate(epoch_lengths)]
            if epochs is not None and epochs != len(lengths):
                raise ValueError(
                    f"epochs={epochs} but epoch_lengths has {len(lengths)} entries")
            runs = [(n, len(list(g))) for n, g in itertools.groupby(lengths)]
        else:
            if epochs is None or steps_per_epoch is None:
                raise TypeError("give epochs and steps_per_epoch, or epoch_lengths")
            _whole("epochs", epochs, 0)
            _whole("steps_per_epoch", steps_per_epoch, 1)
            runs = [(steps_per_epoch, epochs)] if epochs else []
        try:
            ns = exact_ns(seconds_per_step)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"seconds_per_step: {exc}") from None
        cut = False
        if max_steps is not None:
            _whole("max_steps", max_steps, 1)
            done, kept = 0, []
            for length, count in runs:
                if done + length * count < max_steps:
                    kept.append((length, count))
                    done += length * count
                    continue
                whole = (max_steps - done) // length
                if whole:
                    kept.append((length, whole))
                rest = max_steps - done - whole * length
                if rest:
                    kept.append((rest, 1))
                    cut = True
                break
            runs = kept
        return cls(tuple(runs), batches_per_step, samples_per_batch, tokens_per_batch, ns,
                   cut)

    # -- epochs and steps ---------------------------------------------------------------
    @property
    def epochs(self) -> int:
        """Number of epochs (one cut short by ``max_steps`` included)."""
        return self._epoch_at[-1]

    @property
    def ended_epochs(self) -> int:
        """Epochs that reach their ``epoch_end``."""
        return self.epochs - (1 if self.cut_short else 0)

    @property
    def total_steps(self) -> int:
        """Optimizer steps in the whole run."""
        return self._step_at[-1]

    @property
    def seconds_per_step(self) -> float:
        """Training wall time per step, in seconds."""
        return self.ns_per_step / 1e9

    def length(self, epoch: int) -> int:
        """Steps in epoch ``epoch`` (0-based)."""
        return self.runs[bisect.bisect_right(self._epoch_at, epoch) - 1][0]

    def start(self, epoch: int) -> int:
        """Steps completed before ``epoch`` (0-based) begins; ``start(epochs)``: all of them."""
        if epoch >= self.epochs:
            return self.total_steps
        r = bisect.bisect_right(self._epoch_at, epoch) - 1
        return self._step_at[r] + (epoch - self._epoch_at[r]) * self.runs[r][0]

    def epoch_of_step(self, step: int) -> int:
        """Index of the epoch that contains global step ``step`` (1-based); ``epochs`` past
        the end."""
        if step > self.total_steps:
            return self.epochs
        r = bisect.bisect_left(self._step_at, step) - 1
        return self._epoch_at[r] + (step - self._step_at[r] - 1) // self.runs[r][0]

    def first_epoch_starting(self, step: int, *, after: bool) -> int:
        """The smallest epoch index ``e`` (up to ``epochs``) with ``start(e) >= step``,
        or ``> step`` when ``after``; ``epochs + 1`` when there is none."""
        lo, hi = 0, self.epochs + 1
        while lo < hi:
            mid = (lo + hi) // 2
            s = self.start(mid) if mid <= self.epochs else math.inf
            if s > step or (not after and s == step):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def at_steps(self, steps: int, epoch: int, in_epoch: int) -> Timestamp:
        """Counters with ``steps`` steps completed."""
        b = steps * self.batches_per_step
        return Timestamp.make(steps, b, epoch, in_epoch, b * self.samples_per_batch,
                              b * self.tokens_per_batch, steps * self.ns_per_step)

    def min_steps(self, counter: str, due: float) -> float:
        """Fewest completed steps at which a step-driven ``counter`` reaches ``due``."""
        b = self.batches_per_step
        rate = {"step": 1, "batch": b, "sample": b * self.samples_per_batch,
                "token": b * self.tokens_per_batch, "time_ns": self.ns_per_step}[counter]
        return ceil_div(due, rate)


class SimClock(Clock):
    """A clock for a run of known shape; positioned by the simulation, never backwards."""

    def __init__(self, shape: RunShape) -> None:
        self.shape = shape
        self._key: Key = TRAIN_START
        self._set(Timestamp())
        self._prev_step_end = Timestamp()

    def _set(self, ts: Timestamp) -> None:
        self.step, self.batch, self.epoch = ts.step, ts.batch, ts.epoch
        self.step_in_epoch, self.sample, self.token = ts.step_in_epoch, ts.sample, ts.token
        self.time_ns = ts.time_ns

    def _move(self, key: Key, ts: Timestamp) -> None:
        if key < self._key:
            raise ValueError(
                f"time can't go backwards: the clock is at {self._key}, asked for {key}")
        self._key = key
        self._set(ts)

    @property
    def in_epoch(self) -> bool:  # type: ignore[override]
        """Whether the clock is inside an epoch (its start, batches and steps)."""
        return self._key != TRAIN_START and self._key[1] in (PH_BATCH, PH_STEP, PH_EPOCH_START)

    @property
    def key(self) -> Key:
        """Where the clock is in the run's sequence of evaluation points."""
        return self._key

    # -- positioning ----------------------------------------------------------------
    def _step_end_ts(self, step: int) -> Timestamp:
        if step == 0:
            return Timestamp()
        e = self.shape.epoch_of_step(step)
        return self.shape.at_steps(step, e, step - self.shape.start(e))

    def to_step_end(self, step: int) -> None:
        """Move to the end of global step ``step``."""
        sh = self.shape
        if not 1 <= step <= sh.total_steps:
            raise ValueError(f"step {step} is outside the run (1..{sh.total_steps})")
        self._prev_step_end = self._step_end_ts(step - 1)
        self._move((step, PH_STEP, 0), self._step_end_ts(step))

    def to_batch_end(self, batch: int) -> None:
        """Move to the end of global micro-batch ``batch``."""
        sh = self.shape
        done = (batch - 1) // sh.batches_per_step
        e = sh.epoch_of_step(done + 1)
        ts = attrs.evolve(sh.at_steps(done, e, done - sh.start(e)), batch=batch,
                          sample=batch * sh.samples_per_batch,
                          token=batch * sh.tokens_per_batch)
        self._move(batch_key(batch, sh), ts)

    def to_batch_start(self, batch: int) -> None:
        """Move to the start of global micro-batch ``batch``: the batches before it done."""
        sh = self.shape
        done = (batch - 1) // sh.batches_per_step
        e = sh.epoch_of_step(done + 1)
        ts = attrs.evolve(sh.at_steps(done, e, done - sh.start(e)), batch=batch - 1,
                          sample=(batch - 1) * sh.samples_per_batch,
                          token=(batch - 1) * sh.tokens_per_batch)
        self._move(batch_key(batch, sh, start=True), ts)

    def to_epoch_start(self, epoch: int) -> None:
        """Move to the start of epoch ``epoch`` (0-based)."""
        s = self.shape.start(epoch)
        self._move((s, PH_EPOCH_START, 0), self.shape.at_steps(s, epoch, 0))

    def to_epoch_end(self, epoch: int) -> None:
        """Move to the end of epoch ``epoch`` (0-based): the epoch counter becomes ``epoch + 1``."""
        s = self.shape.start(epoch + 1)
        self._move((s, PH_EPOCH_END, 0),
                   self.shape.at_steps(s, epoch + 1, self.shape.length(epoch)))

    def to_custom(self, step: int, index: int) -> None:
        """Move to a custom event fired after step ``step``'s end."""
        self._move((step, PH_STEP, 1 + index), self._step_end_ts(step))

    def to_train_end(self) -> None:
        """Move to the end of training."""
        sh = self.shape
        last = sh.length(sh.epochs - 1) if sh.epochs else 0
        self._move((sh.total_steps, PH_TRAIN_END, 0),
                   sh.at_steps(sh.total_steps, sh.ended_epochs, last))

    def to_stop(self) -> None:
        """Move to ``train_end`` where the clock is: the run stopped here."""
        self._move((self._key[0], PH_TRAIN_END, 0), self.now())

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
        return Timestamp.make(self.step, self.batch, self.epoch, self.step_in_epoch,
                              self.sample, self.token, self.time_ns)

    def previous(self, event: str) -> Timestamp:
        if event == "step_end":
            return self._prev_step_end
        return step_back(self.now(), event)

    def state_dict(self) -> dict[str, Any]:
        return {"key": list(self._key), **super().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._key = (int(state["key"][0]), int(state["key"][1]), int(state["key"][2]))
        self._set(Timestamp.make(**state["now"]))
        self._prev_step_end = Timestamp.make(**state["previous_step_end"])
