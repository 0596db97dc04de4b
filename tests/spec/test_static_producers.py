"""``check`` knows, without importing anything, the metrics a built-in callback puts:
for every built-in it lists, that knowledge equals the built callback's ``produces``."""

from __future__ import annotations

import json

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from schedtrain.spec import loads_spec
from schedtrain.spec.metrics import BUILTIN_PRODUCES, TRAINER_METRICS, static_producers
from schedtrain.spec.registry import BUILTINS
from schedtrain.training.from_spec import build_callbacks

_name = st.from_regex(r"[a-z][a-z0-9_]{0,8}(/[a-z][a-z0-9_]{0,8})?", fullmatch=True)
_prefix = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
_inferencer = st.one_of(
    st.fixed_dictionaries({"type": st.just("ScalarStats")},
                          optional={"names": st.lists(_name, min_size=1, max_size=3,
                                                      unique=True),
                                    "prefix": _prefix}),
    st.fixed_dictionaries({"type": st.just("ClassificationError"),
                           "k": st.integers(1, 10)}, optional={"name": _name}),
)
_args = {
    "InferenceRunner": st.fixed_dictionaries({}, optional={
        "prefix": _prefix, "inferencers": st.lists(_inferencer, min_size=1, max_size=3)}),
    "MovingAverageSummary": st.fixed_dictionaries({}, optional={
        "metrics": st.lists(_name, min_size=1, max_size=3, unique=True),
        "suffix": st.sampled_from(["_ema", "/avg", "_smooth"])}),
}


def _toml(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(_args)).flatmap(
    lambda kind: st.tuples(st.just(kind), _args[kind])))
def test_known_producers_equal_the_built_callbacks(case: tuple[str, dict[str, object]]) -> None:
    kind, args = case
    listed = BUILTIN_PRODUCES[kind](args)
    assume(len(set(listed)) == len(listed))  # the same name twice is refused (tested elsewhere)
    lines = "\n".join(f"{k} = {_toml(v)}" for k, v in args.items())
    spec = loads_spec(f'[callbacks.c]\ntype = "{kind}"\ntrigger = {{ every = "1 epoch" }}\n'
                      f"{lines}\n")
    built = build_callbacks(spec)["c"]
    produced, unknown = static_producers(spec)
    assert unknown == []
    assert produced == {*TRAINER_METRICS, *built.produces}


def test_every_listed_builtin_is_known_and_argumentless_ones_agree() -> None:
    """Each listed built-in exists; built with no arguments, it puts what is listed."""
    assert set(BUILTIN_PRODUCES) <= set(BUILTINS)
    for kind in sorted(BUILTIN_PRODUCES):
        if any(p.required for p in BUILTINS[kind].params):
            continue
        spec = loads_spec(f'[callbacks.c]\ntype = "{kind}"\ntrigger = {{ all = [{{ every = '
                          '"1 epoch" }, { plateau = "train/loss", patience = 2 }] }\n')
        built = build_callbacks(spec)["c"]
        assert set(BUILTIN_PRODUCES[kind]({})) == set(getattr(built, "produces", ())), kind
