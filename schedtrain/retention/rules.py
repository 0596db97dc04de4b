"""The retention rules and what they keep of a saver's records (see the package)."""


from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from schedtrain.errors import describe
from schedtrain.time import MAX_COUNT, Time, Timestamp

__all__ = ["AnyOf", "Best", "Every", "Latest", "Policy", "Rule", "Saved", "retained", "saved_at",
           "saved_row", "spell"]


@attrs.frozen
class Saved:
    """One checkpoint a saver wrote: its file name, when, and the monitored values then.

    Args:
        name: the file name (``step-00000120.pt``).
        at: the clock when it was saved.
        finite: whether its weights and loss were finite (not ``-nonfinite``).
        values: metric name -> value at the save, for ``Best`` rules.
    """

    name: str
    at: Timestamp
    finite: bool = True
    values: Mapping[str, float] = attrs.field(factory=dict)


def _whole(least: int) -> Any:
    def check(_inst: object, attribute: attrs.Attribute[int], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"`{attribute.name}` must be a whole number >= {least}, "
                             f"got {describe(value)}")
        if value > MAX_COUNT:
            raise ValueError(f"`{attribute.name}` must be at most 2**63 - 1, got "
                             f"{describe(value)}")
    return check


@attrs.frozen
class Latest:
    """Keep the newest ``n`` checkpoints (temporary ones: each goes when ``n`` newer exist)."""

    n: int = attrs.field(validator=_whole(1))

    def keeps(self, saved: Sequence[Saved]) -> set[int]:
        """Indexes (into ``saved``, oldest first) of the checkpoints this rule keeps."""
        return set(range(max(0, len(saved) - self.n), len(saved)))

    def monitors(self) -> tuple[str, ...]:
        """Metrics whose values the rule reads."""
        return ()


def _period(value: object) -> Time:
    t = Time.parse(value) if isinstance(value, str) else value
    if not isinstance(t, Time) or t.base <= 0:
        raise ValueError(f"`every` must be a time > 0 such as '10000 steps' or '1 h', "
                         f"got {value!r}")
    return t


def _half_epochs(at: Timestamp) -> int:
    """Where a save is in epochs, doubled: ``2e`` at the boundary after epoch ``e``,
    ``2e + 1`` inside epoch ``e + 1`` (a save between epochs: ``saved_at``)."""
    return 2 * at.epoch + (at.step_in_epoch > 0)


@attrs.frozen
class Every:
    """Keep, for good, the first checkpoint at or after each multiple of ``period``; on
    epochs, the last checkpoint at or before each multiple (the save at the last step of
    epoch 5 runs before the epoch counter moves, and is the one that ends epoch 5)."""

    period: Time = attrs.field(converter=_period)

    def keeps(self, saved: Sequence[Saved]) -> set[int]:
        """Indexes of the checkpoints that are the first to reach a new grid point (on
        epochs: the last before the next save passes one)."""
        counter, base = self.period.counter, self.period.base
        if counter == "epoch":
            # Boundary k (2 * k * base half-epochs, k >= 1) goes to the save at or before
            # it whose next save is past it: known once that next save exists.
            grid = 2 * base
            at = [_half_epochs(s.at) for s in saved]
            return {i for i in range(len(saved) - 1)
                    if (at[i + 1] - 1) // grid > (max(at[i], 1) - 1) // grid}
        kept, before = set(), 0
        for i, s in enumerate(saved):
            now = s.at.get(counter)
            if now // base > before // base:
                kept.add(i)
            before = now
        return kept

    def monitors(self) -> tuple[str, ...]:
        """Metrics whose values the rule reads."""
        return ()


@attrs.frozen
class Best:
    """Keep the ``n`` finite checkpoints with the best value of ``monitor`` (a tie keeps
    the earlier; one saved without a finite value is never among them)."""

    n: int = attrs.field(validator=_whole(1))
    monitor: str = "val/loss"
    mode: Literal["min", "max"] = attrs.field(default="min")

    @mode.validator
    def _check_mode(self, _attribute: object, value: object) -> None:
        if value not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max', got {value!r}")

    def keeps(self, saved: Sequence[Saved]) -> set[int]:
        """Indexes of the best ``n`` checkpoints by ``monitor``."""
        sign = 1.0 if self.mode == "min" else -1.0
        ranked = sorted((sign * v, i) for i, s in enumerate(saved) if s.finite
                        for v in [s.values.get(self.monitor, math.nan)] if math.isfinite(v))
        return {i for _, i in ranked[:self.n]}

    def monitors(self) -> tuple[str, ...]:
        """Metrics whose values the rule reads."""
        return (self.monitor,)


Rule = Latest | Every | Best


@attrs.frozen
class AnyOf:
    """Keep a checkpoint if any of ``rules`` keeps it."""

    rules: tuple[Rule, ...] = attrs.field(converter=tuple[Rule, ...])

    def keeps(self, saved: Sequence[Saved]) -> set[int]:
        """Indexes kept by at least one rule."""
        return set().union(*(r.keeps(saved) for r in self.rules))

    def monitors(self) -> tuple[str, ...]:
        """Metrics whose values the rules read."""
        return tuple(dict.fromkeys(m for r in self.rules for m in r.monitors()))


#: A retention policy: one rule, or rules any of which keeps a checkpoint.
Policy = Latest | Every | Best | AnyOf


def saved_at(at: Timestamp, *, between_epochs: bool) -> Timestamp:
    """A save's clock as its record keeps it: between epochs (at an ``epoch_end``, or
    ``train_end`` after one) ``step_in_epoch`` is 0, the epoch's steps being over, so an
    epoch rule tells it from a save after the next epoch's last step."""
    if not between_epochs:
        return at
    return Timestamp.make(at.step, at.batch, at.epoch, 0, at.sample, at.token, at.time_ns)


def saved_row(row: Any) -> Saved:
    """A saver's record of one file from its checkpoint row ``[name, step, batch, epoch,
    step_in_epoch, sample, token, time_ns, finite, {metric: value}]``.

    Raises:
        TypeError, ValueError: the row is not one.
    """
    name, *counters, finite, values = row
    if len(counters) != 7 or not isinstance(values, dict):
        raise ValueError(f"not a saver's record: {row!r:.80}")
    return Saved(str(name), Timestamp.make(*(int(c) for c in counters)), bool(finite),
                 {str(k): float(v) for k, v in values.items()})


def spell(policy: Policy | None) -> str:
    """``policy`` as its TOML value (``{ any = [{ latest = 3 }, { every = "1 h" }] }``)."""
    if policy is None:
        return "all"
    if isinstance(policy, Latest):
        return f"{{ latest = {policy.n} }}"
    if isinstance(policy, Every):
        return f'{{ every = "{policy.period}" }}'
    if isinstance(policy, Best):
        return f'{{ best = {policy.n}, monitor = "{policy.monitor}", mode = "{policy.mode}" }}'
    return f"{{ any = [{', '.join(spell(r) for r in policy.rules)}] }}"


def retained(policy: Policy | None, saved: Sequence[Saved]) -> set[int]:
    """Indexes of ``saved`` (oldest first) that stay: those ``policy`` keeps (all when
    ``None``) and the newest finite one."""
    if policy is None:
        return set(range(len(saved)))
    keep = policy.keeps(saved)
    finite = [i for i, s in enumerate(saved) if s.finite]
    return keep | set(finite[-1:])


