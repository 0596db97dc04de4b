"""``when``: runtime conditions, parsed by a small grammar and never ``eval``-ed.

Grammar (keywords are lower case)::

    expr       := disj
    disj       := conj ("or" conj)*
    conj       := neg ("and" neg)*
    neg        := "not" neg | "(" expr ")" | comparison | PREDICATE
    comparison := operand OP operand (OP operand)*     # chained: 0.1 < val/loss < 0.5
    operand    := NUMBER [TIME_UNIT] | METRIC | "time_left"
    OP         := "<" | "<=" | ">" | ">=" | "==" | "!="

A bare name is a predicate registered from Python; a name in a comparison is
a metric. A missing metric makes its comparison false. ``time_left`` is not a metric:
it is the seconds left before the run's deadline (``Point.deadline_ns``), and a
number followed by a time unit (``10 min``) is that many seconds, so
``time_left < 10 min`` reads as written; without a deadline it is false.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator
from typing import Final

import attrs

from schedtrain.time import Unit
from schedtrain.triggers.base import Trigger
from schedtrain.triggers.kleene import k_and, k_not, k_or
from schedtrain.triggers.protocol import Point, Predicate

__all__ = ["TIME_LEFT", "Condition", "When", "parse_condition", "when"]

#: The name a condition reads the seconds left before the run's deadline by.
TIME_LEFT: Final = "time_left"

_OPS: Final[dict[str, Callable[[float, float], bool]]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
_SPACE_RE: Final = re.compile(r"\s*")
_TOKEN_RE: Final = re.compile(
    r"(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf\b)"
    r"|(?P<op><=|>=|==|!=|<|>)"
    r"|(?P<paren>[()])"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_./@\-]*)"
)
_KEYWORDS: Final = ("and", "or", "not")
#: How deeply `not` and parentheses may nest in one condition.
MAX_CONDITION_DEPTH: Final = 64


@attrs.frozen
class _Tok:
    kind: str
    text: str
    pos: int


def _tokenize(text: str) -> list[_Tok]:
    """One pass over the text: each token is matched where the previous one ended."""
    toks: list[_Tok] = []
    pos = _SPACE_RE.match(text, 0).end()  # type: ignore[union-attr]  # \s* always matches
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise ValueError(
                f"invalid condition {text!r}: unexpected {text[pos]!r} at position {pos + 1}; "
                "a condition compares metrics with numbers ('val/loss < 0.5') or names "
                "a registered predicate, joined by and/or/not"
            )
        kind = m.lastgroup or ""
        tok_text = m.group(kind)
        end = _SPACE_RE.match(text, m.end()).end()  # type: ignore[union-attr]
        if kind == "name" and tok_text in _KEYWORDS:
            kind = tok_text
        elif kind == "name" and text.startswith("(", end):
            raise ValueError(
                f"invalid condition {text!r}: calls are not allowed "
                f"({text[pos:end + 1]!r} at position {pos + 1}); a condition compares metrics "
                "with numbers ('val/loss < 0.5') or names a predicate registered from Python")
        toks.append(_Tok(kind, tok_text, pos))
        pos = end
    return toks


# -- the syntax tree ----------------------------------------------------------------


@attrs.frozen
class Compare:
    """``operand OP operand (OP operand)*``; operands are metric names or numbers."""

    operands: tuple[str | float, ...]
    ops: tuple[str, ...]


@attrs.frozen
class PredicateRef:
    """A predicate registered by name."""

    name: str


@attrs.frozen
class BoolOp:
    """``and`` / ``or`` over several terms, or ``not`` over one."""

    op: str
    terms: tuple[Condition, ...]


Condition = Compare | PredicateRef | BoolOp


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.depth = 0

    def error(self, expected: str) -> ValueError:
        if self.i < len(self.toks):
            tok = self.toks[self.i]
            found = f"{tok.text!r} at position {tok.pos + 1}"
        else:
            found = "the end of the text"
        return ValueError(f"invalid condition {self.text!r}: expected {expected}, found {found}")

    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, kind: str) -> _Tok | None:
        tok = self.peek()
        if tok is not None and tok.kind == kind:
            self.i += 1
            return tok
        return None

    def parse(self) -> Condition:
        if not self.toks:
            raise ValueError("invalid condition '': it is empty")
        node = self.disj()
        if self.peek() is not None:
            raise self.error("'and', 'or' or the end")
        return node

    def disj(self) -> Condition:
        terms = [self.conj()]
        while self.take("or"):
            terms.append(self.conj())
        return terms[0] if len(terms) == 1 else BoolOp("or", tuple(terms))

    def conj(self) -> Condition:
        terms = [self.neg()]
        while self.take("and"):
            terms.append(self.neg())
        return terms[0] if len(terms) == 1 else BoolOp("and", tuple(terms))

    def neg(self) -> Condition:
        self.depth += 1
        if self.depth > MAX_CONDITION_DEPTH:
            raise ValueError(f"invalid condition {self.text[:40]!r}...: `not` and parentheses "
                             f"nest more than {MAX_CONDITION_DEPTH} levels deep")
        try:
            return self._neg()
        finally:
            self.depth -= 1

    def _neg(self) -> Condition:
        if self.take("not"):
            return BoolOp("not", (self.neg(),))
        if self.take("paren"):
            if self.toks[self.i - 1].text != "(":
                self.i -= 1
                raise self.error("a metric, a number, a predicate name, 'not' or '('")
            node = self.disj()
            close = self.take("paren")
            if close is None or close.text != ")":
                if close is not None:
                    self.i -= 1
                raise self.error("')'")
            return node
        return self.comparison()

    def operand(self) -> str | float | None:
        tok = self.peek()
        if tok is None:
            return None
        if tok.kind == "num":
            self.i += 1
            unit = self.peek()
            if unit is not None and unit.kind == "name":
                seconds = _seconds_per(unit.text)
                if seconds is not None:  # "10 min": a duration, in seconds
                    self.i += 1
                    return float(tok.text) * seconds
            return float(tok.text)
        if tok.kind == "name":
            self.i += 1
            return tok.text
        return None

    def comparison(self) -> Condition:
        first = self.operand()
        if first is None:
            raise self.error("a metric, a number, a predicate name, 'not' or '('")
        operands: list[str | float] = [first]
        ops: list[str] = []
        while (op := self.take("op")) is not None:
            nxt = self.operand()
            if nxt is None:
                raise self.error(f"a metric or a number after {op.text!r}")
            ops.append(op.text)
            operands.append(nxt)
        if not ops:
            if isinstance(first, float):
                raise self.error("a comparison operator after the number")
            return PredicateRef(first)
        if all(isinstance(o, float) for o in operands):
            raise ValueError(
                f"invalid condition {self.text!r}: compares only numbers; name a metric"
            )
        return Compare(tuple(operands), tuple(ops))


def _seconds_per(name: str) -> float | None:
    """Seconds in one time unit ``name`` ("s", "min", "h"...); ``None`` if it is none."""
    try:
        unit = Unit.parse(name)
    except ValueError:
        return None
    return unit.scale / 1e9 if unit.is_time else None


def time_left(pt: Point) -> float | None:
    """Seconds left before the deadline at ``pt`` (``None``: the run has no deadline)."""
    if pt.deadline_ns is None:
        return None
    return (pt.deadline_ns - pt.now.time_ns) / 1e9


def parse_condition(text: str) -> Condition:
    """Parse condition text into a syntax tree; ``ValueError`` says where it is wrong."""
    if not isinstance(text, str):
        raise TypeError(f"a condition must be text such as 'val/loss < 0.5', got {text!r}")
    return _Parser(text).parse()


def _walk(node: Condition) -> Iterator[Condition]:
    yield node
    if isinstance(node, BoolOp):
        for t in node.terms:
            yield from _walk(t)


def _eval(node: Condition, pt: Point) -> bool | None:
    if isinstance(node, BoolOp):
        if node.op == "not":
            return k_not(_eval(node.terms[0], pt))
        values = [_eval(t, pt) for t in node.terms]
        return k_and(values) if node.op == "and" else k_or(values)
    if isinstance(node, PredicateRef):
        if pt.predicates is None:
            return None
        fn = pt.predicates.get(node.name)
        if fn is None:
            raise KeyError(f"predicate {node.name!r} is not registered")
        return bool(fn(pt))
    values_f: list[float] = []
    for operand in node.operands:
        if isinstance(operand, float):
            values_f.append(operand)
            continue
        if operand == TIME_LEFT:
            left = time_left(pt)
            if left is None:
                return False
            values_f.append(left)
            continue
        if pt.metrics is None:
            return None
        mv = pt.metrics.latest(operand)
        if mv is None:
            return False
        values_f.append(float(mv.value))
    # IEEE comparisons, as Python's: a NaN compares false, except with `!=`.
    return all(_OPS[op](values_f[i], values_f[i + 1]) for i, op in enumerate(node.ops))


@attrs.frozen(repr=False)
class When(Trigger):
    """True where a condition holds: ``when("val/loss < 0.5")`` or ``when(callable)``."""

    text: str
    tree: Condition = attrs.field(eq=False, hash=False)
    fn: Predicate | None = attrs.field(default=None, eq=True, hash=False)

    @property
    def dynamic(self) -> bool:
        return True

    def metrics(self) -> frozenset[str]:
        """Metrics the condition reads."""
        names: set[str] = set()
        for n in _walk(self.tree):
            if isinstance(n, Compare):
                names.update(o for o in n.operands if isinstance(o, str) and o != TIME_LEFT)
        return frozenset(names)

    def predicates(self) -> frozenset[str]:
        """Registered predicates the condition calls (none for a Python callable)."""
        if self.fn is not None:
            return frozenset()
        return frozenset(n.name for n in _walk(self.tree) if isinstance(n, PredicateRef))

    @property
    def metric_names(self) -> frozenset[str]:
        """Metrics the condition reads (``metrics()``)."""
        return self.metrics()

    @property
    def predicate_names(self) -> frozenset[str]:
        """Registered predicates the condition calls (``predicates()``)."""
        return self.predicates()

    def evaluate(self, pt: Point) -> bool | None:
        if self.fn is not None:
            return None if pt.predicates is None else bool(self.fn(pt))
        return _eval(self.tree, pt)

    def _reason(self, pt: Point, value: bool | None) -> str:
        if value is None:
            return "needs runtime values"
        if pt.metrics is None:
            return "condition holds" if value else "condition fails"
        seen = ", ".join(
            f"{m}={mv.value:g}" if (mv := pt.metrics.latest(m)) is not None else f"{m} missing"
            for m in sorted(self.metrics())
        )
        return seen or ("predicate holds" if value else "predicate fails")

    def __repr__(self) -> str:
        return f"when({self.text!r})"


def when(condition: str | Predicate) -> When:
    """Fire only while ``condition`` holds (tensorpack's ``EnableCallbackIf``).

    Args:
        condition: text such as ``"val/loss < 0.5 and is_chief"``, or a Python
            callable taking the evaluation ``Point`` (not expressible in TOML).
    """
    if callable(condition):
        name = getattr(condition, "__qualname__", None) or repr(condition)
        return When(f"<{name}>", PredicateRef(name), condition)
    return When(condition, parse_condition(condition))
