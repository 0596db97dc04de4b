"""Callbacks read the run through ``TrainingContext``: what they need of it (its options,
its schedule, the ranks) is declared there, never fetched from the trainer by name."""

from __future__ import annotations

import ast
from pathlib import Path

from schedtrain.callbacks.context import TrainingContext
from schedtrain.integrations.context import HostContext

CALLBACKS = Path(__file__).resolve().parents[2] / "schedtrain" / "callbacks"
#: What the protocol declares: a callback reads these as attributes.
DECLARED = {n for n in vars(TrainingContext) if not n.startswith("_")}


def _mentions_trainer(node: ast.expr) -> bool:
    return any((isinstance(n, ast.Attribute) and n.attr == "trainer")
               or (isinstance(n, ast.Name) and n.id == "trainer") for n in ast.walk(node))


def test_no_callback_fetches_a_declared_member_by_name() -> None:
    """``getattr(trainer, "config", None)`` hides a member the protocol declares (and a
    stand-in that lacks it): every such read goes through the protocol."""
    found = []
    for path in sorted(CALLBACKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in DECLARED and _mentions_trainer(node.args[0])):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_every_context_has_the_run_members() -> None:
    """The own ``Trainer`` and a host's context both have ``config``, ``schedule`` and
    ``comm`` (a host: none of its options or ranks to give)."""
    assert {"config", "schedule", "comm"} <= DECLARED
    host = HostContext("test", clock=None, metrics=None, fire=lambda e: ())  # type: ignore[arg-type]
    assert (host.config, host.schedule, host.comm) == (None, None, None)
