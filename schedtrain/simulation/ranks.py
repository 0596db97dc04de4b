"""Simulate a schedule as it runs on several processes (``torchrun``, N ranks).

Under ``torchrun`` every firing is identical on every rank, so a multi-rank run has one
firing log, and it is the log of a one-process run whose clock and metrics are the
ranks' agreed ones:

* steps and epochs are the same on every rank;
* samples and tokens are global, the sum over ranks: ``samples_per_batch=32`` on 4
  ranks counts 128 samples per micro-batch; ``samples_per_batch=[32, 30]`` gives each
  rank's own size;
* wall time is the chief's (rank 0): ``seconds_per_step`` is the chief's;
* metrics are reduced across ranks before any trigger reads them: the mean by default,
  or ``"sum"``, ``"max"``, ``"min"`` per metric (``reduce=``, as ``[run] reduce``).

``simulate_ranks`` builds that agreed run and simulates it: no processes, no torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from schedtrain.distributed.vocabulary import REDUCE_OPS, reduce_values
from schedtrain.schedule.firings import FiringLog
from schedtrain.schedule.schedule import Schedule
from schedtrain.schedule.table import TriggerTable
from schedtrain.simulation.metric_stream import MetricRecord, records
from schedtrain.simulation.simclock import RunShape
from schedtrain.simulation.simulate import simulate
from schedtrain.time import Time
from schedtrain.triggers.protocol import Predicate

__all__ = ["REDUCE_OPS", "simulate_ranks"]


def _whole(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")
    return value


def _global_rate(name: str, per_rank: int | Sequence[int], world_size: int) -> int:
    """A per-batch count summed over ranks: one size for every rank, or one per rank."""
    if isinstance(per_rank, int) and not isinstance(per_rank, bool):
        return _whole(name, per_rank, 0) * world_size
    if isinstance(per_rank, str | bytes) or not isinstance(per_rank, Sequence):
        raise ValueError(f"{name} must be a whole number >= 0 (per rank) or a list of one "
                         f"per rank, got {per_rank!r}")
    if len(per_rank) != world_size:
        raise ValueError(f"{name} lists {len(per_rank)} per-rank sizes, expected one per "
                         f"rank: {world_size} (world_size)")
    return sum(_whole(f"{name}[{rank}]", n, 0) for rank, n in enumerate(per_rank))


def _check_reduce(reduce: Mapping[str, str]) -> None:
    if not isinstance(reduce, Mapping):
        raise ValueError(f"reduce must be a mapping of metric name -> one of "
                         f"{list(REDUCE_OPS)}, got {reduce!r}")
    for name, op in reduce.items():
        if op not in REDUCE_OPS:
            raise ValueError(f"reduce[{name!r}] must be one of {list(REDUCE_OPS)}, "
                             f"got {op!r}")


def _show(points: Counter[Time]) -> str:
    shown = [str(t) for t in sorted(points.elements(), key=lambda t: (t.counter, t.base))]
    return "[" + ", ".join(shown) + "]" if shown else "none"


def _by_point(stream: list[MetricRecord]) -> dict[str, dict[Time, list[float]]]:
    """A rank's values: metric -> point -> values there, in the order given."""
    out: dict[str, dict[Time, list[float]]] = {}
    for r in stream:
        out.setdefault(r.name, {}).setdefault(r.at, []).append(r.value)
    return out


def _check_streams(rank_metrics: Sequence[Any], world_size: int) -> None:
    if isinstance(rank_metrics, Mapping | str) or not isinstance(rank_metrics, Sequence):
        raise ValueError("rank_metrics must be a list of metric streams, one per rank "
                         f"(rank 0 first), got {type(rank_metrics).__name__}; give "
                         "metrics already reduced across ranks as metrics=...")
    if len(rank_metrics) != world_size:
        raise ValueError(f"rank_metrics gives {len(rank_metrics)} metric streams, "
                         f"expected one per rank: {world_size} (world_size)")


Columns = dict[str, tuple[list[Time], list[float]]]


def _columns(stream: list[MetricRecord]) -> Columns:
    """A rank's values: metric -> (its points, its values), in the order given."""
    out: Columns = {}
    for r in stream:
        points, values = out.setdefault(r.name, ([], []))
        points.append(r.at)
        values.append(r.value)
    return out


def _raw_points(stream: Any) -> dict[str, tuple[list[Any], list[type]]] | None:
    """A ``{name: [(at, value), ...]}`` stream's points as given, and their types."""
    if not isinstance(stream, Mapping) or len({str(k) for k in stream}) != len(stream):
        return None
    out = {}
    for name, series in stream.items():
        if not isinstance(series, list | tuple):
            return None
        points = [at for at, _ in series]
        out[str(name)] = (points, list(map(type, points)))
    return out


def _same_points(stream: Any, first: dict[str, tuple[list[Any], list[type]]],
                 parsed: Columns) -> Columns | None:
    """Another rank's stream as columns, when it names exactly rank 0's points (the same
    values of the same types, metric by metric): they are rank 0's, parsed once; only
    its values are read. ``None`` when it does not."""
    raw = _raw_points(stream)
    if raw is None or raw.keys() != first.keys():
        return None
    if any(raw[name] != first[name] for name in raw):
        return None
    return {str(name): (parsed[str(name)][0], [float(v) for _, v in series])
            for name, series in stream.items() if series}


def _check_points(name: str, ranks: list[dict[str, dict[Time, list[float]]]]) -> None:
    first = Counter({t: len(v) for t, v in ranks[0].get(name, {}).items()})
    for rank, got in enumerate(ranks[1:], 1):
        here = Counter({t: len(v) for t, v in got.get(name, {}).items()})
        if here != first:
            raise ValueError(
                f"metric {name!r} is given at different points on rank {rank} than on "
                f"rank 0 (only on rank 0: {_show(first - here)}; only on rank {rank}: "
                f"{_show(here - first)}): every rank must give a metric's values at the "
                "same points, to be reduced point by point")


def _reduce_streams(rank_metrics: Sequence[Any], ops: Mapping[str, str]) -> list[MetricRecord]:
    """The stream triggers see: the ranks' values reduced point by point, in rank 0's
    order (the k-th value of a metric at a point reduces the k-th values given there).

    Where every rank gives a metric at the same points in the same order (the usual
    case) it is reduced column by column: a rank that names exactly rank 0's points
    costs only the reading of its values, so 1,024 ranks take seconds."""
    times: dict[tuple[type, Any], Time] = {}  # every rank names the same points: parse once
    first = records(rank_metrics[0], times)
    parsed: list[list[MetricRecord] | None] = [first]  # None: read only as rank 0's twin
    columns, raw = [_columns(first)], _raw_points(rank_metrics[0])
    for stream in rank_metrics[1:]:
        same = None if raw is None else _same_points(stream, raw, columns[0])
        parsed.append(None if same is not None else records(stream, times))
        columns.append(same if same is not None else _columns(parsed[-1] or []))
    empty: tuple[list[Time], list[float]] = ([], [])
    reduced: dict[str, list[float]] = {}  # metric -> its reduced values, in rank 0's order
    unaligned: list[str] = []
    for name in dict.fromkeys(name for c in columns for name in c):
        points = columns[0].get(name, empty)[0]
        if all(c.get(name, empty)[0] == points for c in columns[1:]):
            op = ops.get(name, "mean")
            reduced[name] = [reduce_values(v, op) for v in
                             zip(*(c[name][1] for c in columns), strict=True)]
        else:
            unaligned.append(name)
    ranks = [_by_point(records(s, times) if got is None else got)
             for s, got in zip(rank_metrics, parsed, strict=True)] if unaligned else []
    for name in unaligned:
        _check_points(name, ranks)
    out: list[MetricRecord] = []
    seen: Counter[tuple[str, Time]] = Counter()
    nth: Counter[str] = Counter()
    for rec in first:
        if rec.name in reduced:
            value = reduced[rec.name][nth[rec.name]]
            nth[rec.name] += 1
        else:
            k = seen[rec.name, rec.at]
            seen[rec.name, rec.at] += 1
            value = reduce_values([r[rec.name][rec.at][k] for r in ranks],
                                  ops.get(rec.name, "mean"))
        out.append(MetricRecord(rec.at, rec.name, value))
    return out


def simulate_ranks(
    schedule: Schedule | TriggerTable,
    *,
    world_size: int,
    rank_metrics: Sequence[Any] | None = None,
    reduce: Mapping[str, str] | None = None,
    samples_per_batch: int | Sequence[int] = 0,
    tokens_per_batch: int | Sequence[int] = 0,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
    epoch_lengths: Sequence[int] | None = None,
    batches_per_step: int = 1,
    seconds_per_step: float = 0.0,
    metrics: Any = None,
    predicates: Mapping[str, Predicate] | None = None,
    events: Mapping[str, Iterable[int]] | None = None,
    max_steps: int | None = None,
) -> FiringLog:
    """Simulate a run on ``world_size`` processes and return its one firing log.

    The log is the one every rank would record (firings are identical on all ranks),
    with global counters: ``fired_at(log, name, "tokens")`` reads global tokens.

    Args:
        schedule: a ``Schedule`` (or a compiled ``TriggerTable``).
        world_size: the number of processes (``torchrun --nproc-per-node``), >= 1.
        rank_metrics: one metric stream per rank (rank 0 first), each as for
            ``simulate(metrics=...)``; reduced point by point before triggers see them.
        reduce: metric name -> ``"mean"`` (default), ``"sum"``, ``"max"`` or ``"min"``,
            as ``[run] reduce`` / ``Trainer(reduce=...)``.
        samples_per_batch, tokens_per_batch: what one micro-batch adds on each rank:
            one number for every rank, or a list of one per rank; the clock counts
            their sum over ranks.
        seconds_per_step: the chief's (rank 0's) training wall time per step.
        metrics: values already reduced (the same on every rank), as for ``simulate``;
            a metric is given here or in ``rank_metrics``, not both.
        epochs, steps_per_epoch, epoch_lengths, batches_per_step, predicates, events,
            max_steps: as for ``simulate`` (the same on every rank).

    Raises:
        ValueError: ``world_size`` < 1; ``rank_metrics`` without one stream per rank;
            an unknown reduction; a metric at different points on two ranks, or given
            both reduced and per rank; a per-rank size list of the wrong length.
    """
    n = _whole("world_size", world_size, 1)
    _check_reduce(reduce or {})
    ops = dict(reduce or {})
    stream: list[MetricRecord] | None = None if metrics is None else records(metrics)
    if rank_metrics is not None:
        _check_streams(rank_metrics, n)
        reduced = _reduce_streams(rank_metrics, ops)
        both = sorted({r.name for r in stream or ()} & {r.name for r in reduced})
        if both:
            raise ValueError(f"metric {both[0]!r} is given both in metrics (already "
                             "reduced) and in rank_metrics (per rank): give it in one")
        stream = [*(stream or ()), *reduced]
    shape = RunShape.build(
        epochs=epochs, steps_per_epoch=steps_per_epoch, epoch_lengths=epoch_lengths,
        batches_per_step=batches_per_step,
        samples_per_batch=_global_rate("samples_per_batch", samples_per_batch, n),
        tokens_per_batch=_global_rate("tokens_per_batch", tokens_per_batch, n),
        seconds_per_step=seconds_per_step, max_steps=max_steps)
    return simulate(schedule, shape=shape, metrics=stream, predicates=predicates,
                    events=events)
