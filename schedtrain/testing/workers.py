"""Schedule coverage across processes: a pytest-xdist worker's records as plain data,
and the controller's merge of them into the records one process would have kept.

A worker exports each record (``CallbackCoverage.to_data``) with the key the recorder
files it under and where it was first simulated, as a place in the run: ``-1`` outside a
test (collection), else the test's index in the session's items, which every worker
collects alike. The merge ORs what the workers saw of each callback and keeps, for its
``where`` and its place in the report, the earliest sighting, so the report reads as that
of the same session run in one process.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from schedtrain.testing.coverage import CallbackCoverage
from schedtrain.testing.recorder import Recorder

__all__ = ["export", "merge"]


def export(recorder: Recorder, tests: Sequence[str]) -> list[dict[str, Any]]:
    """The recorder's records, in the order it made them, as JSON-able data; ``tests``:
    the session's test ids in run order."""
    index = {nodeid: i for i, nodeid in enumerate(tests)}
    return [{"key": key, "order": -1 if not cov.where else index.get(cov.where, len(tests)),
             "record": cov.to_data()}
            for (_name, key), cov in recorder.callbacks.items()]


def merge(exports: Iterable[Sequence[dict[str, Any]]]) -> list[CallbackCoverage]:
    """One record per callback and trigger from every process's ``export``, in the
    order of their first sighting over the run."""
    merged: dict[tuple[str, str], tuple[tuple[int, int], CallbackCoverage]] = {}
    for records in exports:
        for seq, item in enumerate(records):
            cov = CallbackCoverage.from_data(item["record"])
            key, first = (cov.name, item["key"]), (int(item["order"]), seq)
            found = merged.get(key)
            if found is None:
                merged[key] = (first, cov)
                continue
            earliest, kept = found
            kept.merge(cov)
            if first < earliest:
                kept.where = cov.where
                merged[key] = (first, kept)
    return [cov for _first, cov in sorted(merged.values(), key=lambda item: item[0])]
