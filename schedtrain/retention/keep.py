"""``keep`` as a spec or a saver writes it: parsed into a policy, every problem named by
its key path (see the package)."""

from __future__ import annotations

from typing import Literal

from schedtrain.errors import describe
from schedtrain.retention.rules import AnyOf, Best, Every, Latest, Policy, Rule
from schedtrain.time import MAX_COUNT

__all__ = ["SaverKind", "Where", "parse_keep", "policy_problems", "saver_keep",
           "saver_keep_problems"]


Where = tuple[str | int, ...]

_RULE_KEYS = {"latest": ("latest",), "every": ("every",),
              "best": ("best", "monitor", "mode")}


def _rule(table: object, where: Where, problems: list[tuple[Where, str]]) -> Policy | None:
    example = "{ latest = 3 }, { every = '10000 steps' }, { best = 2, monitor = 'val/loss' }"
    if isinstance(table, int) and not isinstance(table, bool):
        if table > MAX_COUNT:
            problems.append((where, f"expected at most 2**63 - 1 checkpoints, found "
                                    f"{describe(table)}"))
            return None
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
    if count > MAX_COUNT:
        problems.append(((*where, kind), f"expected at most 2**63 - 1 checkpoints, found "
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
