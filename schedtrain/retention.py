"""Which checkpoints a saver keeps: retention rules in the schedule's vocabulary.

A policy is a rule or ``AnyOf`` rules; a checkpoint is kept if any rule keeps it, and the
newest finite one is always kept besides (a diverged run has a good one to go back to).
``Latest(3)`` keeps the newest three (temporary: each is deleted once three newer ones
exist); ``Every(Time.parse("10000 steps"))`` keeps the first checkpoint at or after each
multiple of the period, on any counter (``"1 h"`` is a training-time grid), for good
(permanent), and on epochs the last one at or before each multiple (the one that ends
epoch 5, 10...); ``Best(2, "val/loss", "min")`` keeps the two best by a metric's value at
the save. The rules are pure functions of the saves' records, so a simulated run and a
real run keep the same files, and a resumed run, given the records back, keeps the same.
Torch-free: ``schedtrain plan`` evaluates it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from schedtrain.errors import describe
from schedtrain.time import Time, Timestamp

__all__ = [
    "AnyOf",
    "Best",
    "Every",
    "Latest",
    "Policy",
    "Saved",
    "SaverKind",
    "parse_keep",
    "policy_problems",
    "retained",
    "saved_at",
    "saved_row",
    "saver_keep",
    "saver_keep_problems",
    "spell",
]


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
                             f"got {value!r}")
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


Where = tuple[str | int, ...]

_RULE_KEYS = {"latest": ("latest",), "every": ("every",),
              "best": ("best", "monitor", "mode")}


def _rule(table: object, where: Where, problems: list[tuple[Where, str]]) -> Policy | None:
    example = "{ latest = 3 }, { every = '10000 steps' }, { best = 2, monitor = 'val/loss' }"
    if isinstance(table, int) and not isinstance(table, bool):
        if table >= 1:
            return Latest(table)
        problems.append((where, f"expected a whole number >= 1 or a table such as "
                                f"{example}, found {describe(table)}"))
        return None
    if not isinstance(table, dict):
        problems.append((where, f"expected a whole number >= 1 or a table such as {example}, "
                                f"found {describe(table)}"))
        return None
    if "any" in table:
        extra = sorted(set(table) - {"any"})
        rules = table["any"]
        if extra:
            problems.append(((*where, extra[0]), "`any` takes no other key beside it"))
            return None
        if not isinstance(rules, list) or not rules:
            problems.append(((*where, "any"), f"expected a non-empty list of rules such as "
                                              f"[{example}], found {describe(rules)}"))
            return None
        for i, r in enumerate(rules):
            # `keep = N` is `latest`; in a list beside other rules a bare N reads as either.
            if isinstance(r, int) and not isinstance(r, bool):
                problems.append(((*where, "any", i), f"expected a rule table such as "
                                 f"{{ latest = {r} }} or {{ every = '{r} epochs' }} (a "
                                 f"bare number in `any` is ambiguous), found {describe(r)}"))
                return None
        parts = [_rule(r, (*where, "any", i), problems) for i, r in enumerate(rules)]
        flat: list[Rule] = []
        for p in parts:
            if p is None:
                return None
            flat.extend(p.rules if isinstance(p, AnyOf) else [p])
        return AnyOf(flat)
    kinds = [k for k in _RULE_KEYS if k in table]
    if len(kinds) != 1:
        problems.append((where, f"expected exactly one of 'latest', 'every', 'best' or 'any' "
                                f"(such as {example}), found {describe(table)}"))
        return None
    kind = kinds[0]
    for key in table:
        if key not in _RULE_KEYS[kind]:
            problems.append(((*where, key), f"unknown key {key!r} for a {kind!r} rule; it "
                                            f"takes {', '.join(_RULE_KEYS[kind])}"))
            return None
    count = table.get(kind) if kind != "every" else 1
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        problems.append(((*where, kind), f"expected a whole number >= 1, found "
                                         f"{describe(count)}"))
        return None
    try:
        if kind == "latest":
            return Latest(table["latest"])
        if kind == "every":
            return Every(table["every"])
        if "monitor" not in table:
            problems.append((where, f"a best rule needs the metric it ranks by: expected "
                                    f"{{ best = {count}, monitor = 'val/loss' }} (and mode = "
                                    f"'max' where higher is better), found no monitor"))
            return None
        monitor = table["monitor"]
        if not isinstance(monitor, str) or not monitor.strip():
            problems.append(((*where, "monitor"), f"expected a metric name such as "
                                                  f"'val/loss', found {describe(monitor)}"))
            return None
        return Best(table["best"], monitor, table.get("mode", "min"))
    except ValueError as exc:  # the period, or the mode
        problems.append(((*where, "every" if kind == "every" else "mode"), str(exc)))
        return None


def policy_problems(value: object, where: Where = ("keep",)) -> list[tuple[Where, str]]:
    """Each problem of a TOML ``keep`` value, at its key path below the callback."""
    problems: list[tuple[Where, str]] = []
    _rule(value, where, problems)
    return problems


def parse_keep(value: object) -> Policy | None:
    """A ``keep`` argument as a policy: ``None`` (keep all), ``N`` (``Latest(N)``), a
    policy, or its TOML table.

    Raises:
        ValueError: the value is not a valid policy (the first problem, with its path).
    """
    if value is None or isinstance(value, Latest | Every | Best | AnyOf):
        return value
    problems: list[tuple[Where, str]] = []
    policy = _rule(value, ("keep",), problems)
    if problems:
        where, message = problems[0]
        raise ValueError(f"{'.'.join(str(w) for w in where)}: {message}")
    return policy


#: Which savers take which rules: a ``MinSaver``/``MaxSaver``'s history of new bests
#: (each save is a new best, so a ``best`` rule would only keep the newest), a
#: ``TopKSaver``'s ranked files (a ``best`` rule by its own monitor is what it ranks by).
SaverKind = Literal["ModelSaver", "MinSaver", "MaxSaver", "TopKSaver"]


def _leaves(value: object, where: Where) -> list[tuple[Where, object]]:
    """The rules of a TOML ``keep`` value with their key paths (``any`` flattened)."""
    if isinstance(value, dict) and isinstance(value.get("any"), list):
        return [leaf for i, r in enumerate(value["any"]) for leaf in _leaves(r, (*where, "any", i))]
    return [(where, value)]


def _with_ranking(value: object, monitor: str, mode: str) -> object:
    """A ``TopKSaver``'s ``keep`` table with its ``best`` rules' missing ``monitor`` and
    ``mode`` taken from the saver's own."""
    if isinstance(value, dict) and isinstance(value.get("any"), list):
        return {**value, "any": [_with_ranking(r, monitor, mode) for r in value["any"]]}
    if isinstance(value, dict) and "best" in value:
        return {"monitor": monitor, "mode": mode, **value}
    return value


def saver_keep_problems(kind: SaverKind, value: object, monitor: str = "val/loss",
                        mode: str = "min", where: Where = ("keep",)) -> list[tuple[Where, str]]:
    """Each problem of a saver's TOML ``keep``: those of any policy, and the rules that
    make no sense for ``kind`` (``monitor``/``mode``: the saver's own)."""
    if kind != "ModelSaver":  # its best rules rank by the saver's monitor (or are refused)
        value = _with_ranking(value, monitor, mode)
    problems = policy_problems(value, where)
    if problems or kind == "ModelSaver":
        return problems
    leaves = _leaves(value, where)
    if kind in ("MinSaver", "MaxSaver"):
        return [(path, f"each save of a {kind} is a new best of its monitor, so a best rule "
                       "would keep the newest ones: write { latest = N } for the history")
                for path, leaf in leaves if isinstance(leaf, dict) and "best" in leaf]
    if isinstance(value, int):
        return [(where, f"a TopKSaver's keep = N is ambiguous: write save_top_k = {value} "
                        f"(or {{ best = {value} }}) for the best {value}")]
    out: list[tuple[Where, str]] = []
    for path, leaf in leaves:
        if not isinstance(leaf, dict) or "best" not in leaf:
            continue
        for key, own in (("monitor", monitor), ("mode", mode)):
            if leaf[key] != own:
                out.append(((*path, key), f"a TopKSaver ranks by its own {key} {own!r}; "
                                          f"this best rule says {leaf[key]!r} (leave it out)"))
    if not any(isinstance(leaf, dict) and "best" in leaf for _, leaf in leaves):
        out.append((where, "a TopKSaver keeps the best by its monitor: its keep needs a "
                           "best rule such as { best = 3 } (ModelSaver keeps the newest)"))
    return out


def saver_keep(kind: SaverKind, value: object, monitor: str = "val/loss",
               mode: str = "min") -> Policy | None:
    """A saver's ``keep`` argument as a policy, refusing rules that make no sense for it
    (``saver_keep_problems``); a ``Policy`` object is checked the same way.

    Raises:
        ValueError: the first problem, with its path.
    """
    if value is None:
        return None
    if isinstance(value, Latest | Every | Best | AnyOf):
        rules = value.rules if isinstance(value, AnyOf) else (value,)
        raw: object = {"any": [_raw(r) for r in rules]}
    else:
        raw = value
    problems = saver_keep_problems(kind, raw, monitor, mode)
    if problems:
        where, message = problems[0]
        raise ValueError(f"{'.'.join(str(w) for w in where)}: {message}")
    if kind == "TopKSaver":
        raw = _with_ranking(raw, monitor, mode)
    return value if isinstance(value, Latest | Every | Best | AnyOf) else parse_keep(raw)


def _raw(rule: Rule) -> dict[str, object]:
    """A rule as its TOML table (to check a policy given from Python like one from TOML)."""
    if isinstance(rule, Latest):
        return {"latest": rule.n}
    if isinstance(rule, Every):
        return {"every": str(rule.period)}
    return {"best": rule.n, "monitor": rule.monitor, "mode": rule.mode}
