"""Every example in examples/seeds runs, on CPU, and shows what its docstring says."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT / "examples" / "seeds"


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))


def test_every_example_is_a_script() -> None:
    """Each public module has a main() and runs it as ``python -m examples.seeds.NAME``."""
    for path in SEEDS.glob("[!_]*.py"):
        tree = ast.parse(path.read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), path
        assert 'if __name__ == "__main__":' in path.read_text(), path


def test_classification_metrics(tmp_path: Path) -> None:
    """torchmetrics' accuracy over the eval steps equals InferenceRunner's, and one
    confusion matrix per evaluation, over every validation sample, lands in a file."""
    pytest.importorskip("torchmetrics")
    from examples.seeds import classification_metrics

    result = classification_metrics.main(tmp_path, epochs=2)
    ours = [v for _, v in result["val/accuracy"]]
    theirs = [v for _, v in result["val/tm_accuracy"]]
    assert theirs == pytest.approx(ours, abs=1e-6)
    assert len(result["confusion"]) == 2
    for line in result["confusion"]:
        matrix = torch.tensor(line["matrix"])
        assert matrix.shape == (10, 10)
        assert int(matrix.sum()) == 64  # the validation split
    assert [c["step"] for c in result["confusion"]] == [s for s, _ in result["val/accuracy"]]


def test_verify_batch() -> None:
    """Every full batch is checked; a short last batch stops training with its shape."""
    from examples.seeds import verify_batch

    assert verify_batch.main() == 250 // 16
    with pytest.raises(ValueError, match=r"step 16: images of shape \(10, 1, 28, 28\)"):
        verify_batch.main(drop_last=False)


def test_custom_event() -> None:
    """The listener gets the batch of each event inside its window (the first 3 steps)."""
    from examples.seeds import custom_event

    assert custom_event.main() == [(16, 1, 28, 28)] * 3


def test_printing_callback(capsys: pytest.CaptureFixture[str]) -> None:
    """Lightning's lines, in Lightning's order, then the end of training."""
    from examples.seeds import printing_callback

    printing_callback.main()
    assert capsys.readouterr().out.splitlines() == [
        "Starting to init trainer!", "trainer is init now", "training starts at step 0",
        "do something when training ends (step 4)"]


def test_persisted_state(tmp_path: Path) -> None:
    """Stopped and resumed, the callback's state ends exactly as in one run."""
    from examples.seeds import persisted_state

    whole, resumed = persisted_state.main(tmp_path)
    assert whole.count == resumed.count == 64
    assert torch.equal(whole.total, resumed.total)
    assert torch.equal(whole.best, resumed.best)
