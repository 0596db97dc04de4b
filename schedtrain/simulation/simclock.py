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
from schedtrain.simulation.counts import (
    Rate,
    batches_for,
    ceil_div,
    count_at,
    cut_runs,
    epoch_batches,
    rate_of,
    sums_of,
    whole,
)
from schedtrain.time import MAX_COUNT, Timestamp, exact_ns

__all__ = ["Key", "RunShape", "SimClock", "batch_key", "ceil_div"]

#: Position of a point in a run: (completed steps, phase, sub-position).
Key = tuple[int, int, int]
TRAIN_START: Key = (0, -1, 0)
PH_BATCH, PH_STEP, PH_EPOCH_END, PH_EPOCH_START, PH_TRAIN_END = 0, 1, 2, 3, 4


def batch_key(batch: int, shape: RunShape, *, start: bool = False) -> Key:
    """The position of micro-batch ``batch``'s end (or start): under ``PH_BATCH`` of the
    step it belongs to, sub-position ``2 * batch`` for its end and one less for its start,
    so each batch's start falls between the previous batch's end and its own."""
    return (shape.step_of_batch(batch), PH_BATCH, 2 * batch - start)


@attrs.frozen
class RunShape:
    """The shape of a simulated run.

    Args:
        runs: ``(steps per epoch, number of such epochs)`` in order; ``build`` makes them.
        batches_per_step: micro-batches per optimizer step (gradient accumulation).
        samples_per_batch, tokens_per_batch: what each micro-batch adds to the counters:
            one number, or a tuple of one epoch's batches in order (an uneven last batch:
            ``(4, 4, 2)``), the same each epoch.
        ns_per_step: training wall time per optimizer step, in nanoseconds.
        cut_short: the last epoch was cut by ``max_steps``: it starts but does not end
            (no ``epoch_end``), as in the training loop.
        batches_per_epoch: micro-batches in each epoch, when an epoch ends on a partial
            accumulation step (10 batches, 3 a step: steps of 3, 3, 3 and 1); ``None``:
            every step takes ``batches_per_step``.
    """

    runs: tuple[tuple[int, int], ...]
    batches_per_step: int = 1
    samples_per_batch: Rate = 0
    tokens_per_batch: Rate = 0
    ns_per_step: int = 0
    cut_short: bool = False
    batches_per_epoch: int | None = None
    _epoch_at: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)
    _step_at: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)
    _sample_sums: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)
    _token_sums: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        for i, (length, count) in enumerate(self.runs):
            whole(f"epoch_lengths (run {i})", length, 1)
            whole(f"epochs (run {i})", count, 1)
        whole("batches_per_step", self.batches_per_step, 1)
        for name in ("samples_per_batch", "tokens_per_batch"):
            object.__setattr__(self, name, rate_of(name, getattr(self, name)))
        whole("ns_per_step", self.ns_per_step, 0)
        bpe = self.batches_per_epoch
        if bpe is not None:
            whole("batches_per_epoch", bpe, 1)
            spe = self._spe
            if any(n != spe for n, _ in self.runs[:-1]) or (
                    self.runs and not (self.runs[-1][0] == spe
                                       or (self.cut_short and self.runs[-1][0] < spe))):
                raise ValueError(f"batches_per_epoch={bpe} makes epochs of {spe} steps; "
                                 "give epochs of that length")
        for name in ("samples_per_batch", "tokens_per_batch"):
            rate = getattr(self, name)
            if isinstance(rate, tuple) and len(rate) != bpe:
                raise ValueError(f"{name} lists {len(rate)} batches but batches_per_epoch "
                                 f"is {bpe}; list one number per batch of an epoch")
        object.__setattr__(self, "_sample_sums", sums_of(self.samples_per_batch))
        object.__setattr__(self, "_token_sums", sums_of(self.tokens_per_batch))
        epoch_at, step_at = [0], [0]
        for length, count in self.runs:
            epoch_at.append(epoch_at[-1] + count)
            step_at.append(step_at[-1] + length * count)
        object.__setattr__(self, "_epoch_at", tuple(epoch_at))
        object.__setattr__(self, "_step_at", tuple(step_at))
        if self.batches_at(step_at[-1]) > MAX_COUNT:
            raise ValueError(f"a run of {step_at[-1]} steps is longer than this library "
                             f"counts ({MAX_COUNT} batches)")

    @classmethod
    def build(
        cls,
        *,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        epoch_lengths: Sequence[int] | None = None,
        batches_per_step: int = 1,
        samples_per_batch: int | Sequence[int] = 0,
        tokens_per_batch: int | Sequence[int] = 0,
        seconds_per_step: float = 0.0,
        max_steps: int | None = None,
        batches_per_epoch: int | None = None,
    ) -> RunShape:
        """From ``epochs`` and ``steps_per_epoch``, or from ``epoch_lengths``, or from
        ``epochs`` and ``batches_per_epoch`` (steps per epoch: ``batches_per_epoch /
        batches_per_step`` rounded up, the last step of an epoch taking the rest).

        ``samples_per_batch`` (or ``tokens_per_batch``) as a list gives one epoch's
        batches in order, the same each epoch (``[4, 4, 2]``: 10 samples in batches of
        4); its length is the epoch's batch count when ``batches_per_epoch`` is not given.
        ``seconds_per_step`` is read exactly as written (``0.35`` is 350,000,000 ns).
        ``max_steps`` ends the run right after that step, as the trainer does: an epoch
        it cuts short has no ``epoch_end``.
        """
        samples = rate_of("samples_per_batch", samples_per_batch)
        tokens = rate_of("tokens_per_batch", tokens_per_batch)
        batches_per_epoch, spe = epoch_batches(batches_per_epoch, batches_per_step,
                                                samples, tokens, epoch_lengths)
        if spe is not None:
            if steps_per_epoch is not None and steps_per_epoch != spe:
                raise ValueError(
                    f"steps_per_epoch={steps_per_epoch} but {batches_per_epoch} batches "
                    f"per epoch, {batches_per_step} a step, make {spe} steps")
            steps_per_epoch = spe
        if epoch_lengths is not None:
            if steps_per_epoch is not None:
                raise TypeError("give steps_per_epoch or epoch_lengths, not both")
            lengths = [whole(f"epoch_lengths[{i}]", n, 1) for i, n in enumerate(epoch_lengths)]
            if epochs is not None and epochs != len(lengths):
                raise ValueError(
                    f"epochs={epochs} but epoch_lengths has {len(lengths)} entries")
            runs = [(n, len(list(g))) for n, g in itertools.groupby(lengths)]
        else:
            if epochs is None or steps_per_epoch is None:
                raise TypeError("give epochs and steps_per_epoch, or epoch_lengths")
            whole("epochs", epochs, 0)
            whole("steps_per_epoch", steps_per_epoch, 1)
            runs = [(steps_per_epoch, epochs)] if epochs else []
        try:
            ns = exact_ns(seconds_per_step)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"seconds_per_step: {exc}") from None
        cut = False
        if max_steps is not None:
            runs, cut = cut_runs(runs, whole("max_steps", max_steps, 1))
        return cls(tuple(runs), batches_per_step, samples, tokens, ns, cut,
                   batches_per_epoch)

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

    # -- counters as functions of the position ----------------------------------------------
    @property
    def _spe(self) -> int:
        """Steps in an epoch of ``batches_per_epoch`` batches."""
        return -(-(self.batches_per_epoch or 0) // self.batches_per_step)

    def batches_at(self, steps: int) -> int:
        """Micro-batches done when ``steps`` steps are."""
        if self.batches_per_epoch is None:
            return steps * self.batches_per_step
        q, r = divmod(steps, self._spe)  # an epoch's last step may take fewer batches
        return q * self.batches_per_epoch + r * self.batches_per_step

    def step_of_batch(self, batch: int) -> int:
        """The global step (1-based) that micro-batch ``batch`` (1-based) belongs to."""
        if self.batches_per_epoch is None:
            return (batch - 1) // self.batches_per_step + 1
        q, r = divmod(batch - 1, self.batches_per_epoch)
        return q * self._spe + r // self.batches_per_step + 1

    def samples_at(self, batch: int) -> int:
        """Samples counted when ``batch`` micro-batches are done."""
        return count_at(self.samples_per_batch, self._sample_sums, batch)

    def tokens_at(self, batch: int) -> int:
        """Tokens counted when ``batch`` micro-batches are done."""
        return count_at(self.tokens_per_batch, self._token_sums, batch)

    def min_batches(self, counter: str, due: float) -> float:
        """Fewest micro-batches at whose end ``counter`` ("batch", "sample" or "token")
        reaches ``due`` (inf when it never does)."""
        if counter == "sample":
            return batches_for(self.samples_per_batch, self._sample_sums, due)
        if counter == "token":
            return batches_for(self.tokens_per_batch, self._token_sums, due)
        return ceil_div(due, 1)

    def at_steps(self, steps: int, epoch: int, in_epoch: int) -> Timestamp:
        """Counters with ``steps`` steps completed."""
        b = self.batches_at(steps)
        return Timestamp.make(steps, b, epoch, in_epoch, self.samples_at(b),
                              self.tokens_at(b), steps * self.ns_per_step)

    def min_steps(self, counter: str, due: float) -> float:
        """Fewest completed steps at which a step-driven ``counter`` reaches ``due``."""
        if counter in ("step", "time_ns"):
            return ceil_div(due, 1 if counter == "step" else self.ns_per_step)
        b = self.min_batches(counter, due)
        # the step that holds the batch reaching it: the first whose end has it done
        return b if b == 0 or math.isinf(b) else self.step_of_batch(int(b))


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
        done = sh.step_of_batch(batch) - 1
        e = sh.epoch_of_step(done + 1)
        ts = attrs.evolve(sh.at_steps(done, e, done - sh.start(e)), batch=batch,
                          sample=sh.samples_at(batch), token=sh.tokens_at(batch))
        self._move(batch_key(batch, sh), ts)

    def to_batch_start(self, batch: int) -> None:
        """Move to the start of global micro-batch ``batch``: the batches before it done."""
        sh = self.shape
        done = sh.step_of_batch(batch) - 1
        e = sh.epoch_of_step(done + 1)
        ts = attrs.evolve(sh.at_steps(done, e, done - sh.start(e)), batch=batch - 1,
                          sample=sh.samples_at(batch - 1), token=sh.tokens_at(batch - 1))
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
