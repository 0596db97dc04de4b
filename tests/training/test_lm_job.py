"""The token-scheduled main job: specs/lm_tokens.toml training examples/lm.py."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain import Time, Unit
from schedtrain.cli import main
from schedtrain.spec import load_spec

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.lm import (  # noqa: E402 - the repository root is on sys.path now
    VOCAB,
    encode,
    make_task,
    read_corpus,
)

SPEC = ROOT / "specs" / "lm_tokens.toml"
COUNTERS = ("callback", "event", "step", "batch", "epoch", "step_in_epoch", "sample", "token")
#: the short run: a smaller corpus (8 batches an epoch) and model, 64 steps
SHORT = {"corpus_chars": 40_000, "dim": 16, "hidden": 32}
SHORT_MAX_STEPS = 64


def _short_spec(tmp_path: Path) -> Path:
    """specs/lm_tokens.toml with a smaller corpus and model, as a user would shorten it."""
    (tmp_path / "lm_short_task.py").write_text(
        "from examples.lm import make_task as _make\n\n\n"
        f"def make_task():\n    return _make(**{SHORT!r})\n")
    steps_per_epoch = len(make_task(**SHORT).train_data)  # type: ignore[arg-type]
    text = SPEC.read_text()
    for old, new in (('"examples.lm:make_task"', '"lm_short_task:make_task"'),
                     ("max_steps = 120 ", f"max_steps = {SHORT_MAX_STEPS} "),
                     ("epochs = 2 ", f"epochs = {SHORT_MAX_STEPS} "),
                     ("steps_per_epoch = 87", f"steps_per_epoch = {steps_per_epoch}"),
                     ("\nmax_steps = 120", f"\nmax_steps = {SHORT_MAX_STEPS}")):
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / "specs").mkdir()
    path = tmp_path / "specs" / "lm_short.toml"  # its parent's parent holds the task module
    path.write_text(text)
    return path


def _token_periods(spec: Path) -> dict[str, int]:
    """Each callback's ``every`` in tokens, read from the spec's tables."""
    doc = tomllib.loads(spec.read_text())
    triggers = {"log": doc["callbacks"]["log"]["trigger"],
                "validate": doc["triggers"]["validation"]["any"][0],
                "checkpoint": doc["callbacks"]["checkpoint"]["trigger"]["any"][0]}
    out = {}
    for name, table in triggers.items():
        t = Time.parse(table["every"])
        assert t.unit is Unit.TOKEN
        out[name] = t.base
    return out


class TestSpecDescribesTheTask:
    """The spec's [clock] is the default task's real shape, so `plan` shows the real run."""

    def test_clock_matches_the_default_task(self) -> None:
        """Steps per epoch, samples and tokens per batch, and max_steps agree."""
        spec = load_spec(SPEC)
        task = make_task()
        batch = next(iter(task.train_data))
        assert spec.clock.steps_per_epoch == len(task.train_data)  # type: ignore[arg-type]
        assert spec.clock.samples_per_batch == len(batch.inputs)
        assert spec.clock.tokens_per_batch == batch.num_tokens == batch.inputs.numel()
        assert spec.run is not None and spec.clock.max_steps == spec.run.max_steps


class TestShortRun:
    """A shortened run of the spec fires, in tokens, exactly where `plan` says."""

    def test_firings_equal_plan(self, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
        """`schedtrain train` and `schedtrain plan --format json` list the same firings."""
        spec = _short_spec(tmp_path)
        run_dir = tmp_path / "run"
        assert main(["train", str(spec), "--run-dir", str(run_dir)]) == 0
        capsys.readouterr()
        assert main(["plan", str(spec), "--format", "json"]) == 0
        planned = json.loads(capsys.readouterr().out)["firings"]
        rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
        fired = [r for r in rows if r["kind"] == "firing"]
        assert [[f[k] for k in COUNTERS] for f in fired] == \
            [[f[k] for k in COUNTERS] for f in planned]
        tokens = SHORT_MAX_STEPS * 32 * 128
        assert fired[-1]["token"] == tokens and fired[-1]["sample"] == SHORT_MAX_STEPS * 32
        for name, k in _token_periods(spec).items():
            steps = [f["step"] for f in fired if f["callback"] == name and f["event"] == "step_end"]
            # Crossing rule: one firing at the first step whose token count passes each
            # multiple of the period.
            assert steps == [math.ceil(m * k / (32 * 128)) for m in range(1, tokens // k + 1)]
        losses = [r["value"] for r in rows if r.get("name") == "val/loss"]
        assert losses[-1] < math.log(len(VOCAB) + 1) - 1  # learns: well below uniform guessing
        bpc = [r["value"] for r in rows if r.get("name") == "val/bpc"]
        assert bpc == pytest.approx([v / math.log(2) for v in losses])


class TestCorpus:
    """The corpus is the stdlib's source, cut deterministically."""

    @settings(max_examples=20, deadline=None)
    @given(st.integers(1, 30_000), st.integers(0, 30_000))
    def test_prefix_of_a_longer_cut(self, n: int, more: int) -> None:
        """A corpus of n characters is exactly the first n of any longer one."""
        short = read_corpus(n)
        assert len(short) == n
        assert read_corpus(n + more)[:n] == short

    def test_too_long_names_the_argument(self) -> None:
        """Asking for more than the standard library holds is a ValueError naming it."""
        with pytest.raises(ValueError, match=r"corpus_chars=10000000000"):
            read_corpus(10**10)

    def test_too_small_or_bad_split_names_the_argument(self) -> None:
        """A corpus too small for one batch, or a split outside (0, 1), is refused by name."""
        with pytest.raises(ValueError, match=r"corpus_chars=1000: too few characters"):
            make_task(corpus_chars=1000)
        with pytest.raises(ValueError, match=r"val_fraction=0: expected a share"):
            make_task(val_fraction=0)

    @settings(max_examples=30, deadline=None)
    @given(st.text(max_size=50))
    def test_encode_ids(self, text: str) -> None:
        """Vocabulary characters keep their own id; every other character gets the last id."""
        ids = encode(text).tolist()
        assert ids == [VOCAB.index(c) if c in VOCAB else len(VOCAB) for c in text]
