"""``export = ["safetensors"]``: the model's weights (final and best) written as safetensors,
which other tools load without schedtrain or pickle."""

from __future__ import annotations

import builtins
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file
from training_helpers import UnevenData, tiny_model

import schedtrain
from schedtrain.callbacks import Callback, MaxSaver, MinSaver
from schedtrain.checkpoints import read_checkpoint
from schedtrain.checkpoints.export import ExportError, export_weights
from schedtrain.training import Trainer

mse = torch.nn.functional.mse_loss


class Feed(Callback):
    """Puts the scripted ``val/loss`` of each epoch."""

    may_stop_alone = False
    produces = ("val/loss",)

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def _trigger(self) -> None:
        self.metrics.put("val/loss", self.values[self.now.epoch - 1])


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _fit(run_dir: Path, *callbacks: Callback, epochs: int = 2, **kw: Any) -> Trainer:
    model, opt = tiny_model()
    t = Trainer(model, opt, UnevenData([3] * epochs), mse, callbacks=list(callbacks),
                max_epochs=epochs, run_dir=run_dir, export=["safetensors"], **kw)
    t.fit()
    return t


class Tied(torch.nn.Module):
    """An encoder and decoder sharing one weight (as language models tie embeddings)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.out = torch.nn.Linear(3, 5, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(x))


def test_final_export_equals_the_weights_training_ended_with(tmp_path: Path) -> None:
    """RUN_DIR/export/final.safetensors loads with plain safetensors and equals the
    model's state dict, with step, epoch and version as metadata."""
    t = _fit(tmp_path)
    path = tmp_path / "export" / "final.safetensors"
    assert _same(load_file(path), t.model.state_dict())
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    assert meta["step"] == str(t.clock.step) and meta["epoch"] == "2"
    assert meta["schedtrain"] == schedtrain.__version__


def test_final_export_loads_into_a_fresh_model(tmp_path: Path) -> None:
    """A fresh model given the exported weights predicts as the trained one."""
    t = _fit(tmp_path)
    fresh, _ = tiny_model()
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)
    fresh.load_state_dict(load_file(tmp_path / "export" / "final.safetensors"))
    x = torch.randn(4, 3)
    assert torch.equal(fresh(x), t.model(x))


def test_no_export_without_the_option(tmp_path: Path) -> None:
    """Without ``export`` no export folder is made."""
    model, opt = tiny_model()
    Trainer(model, opt, UnevenData([3]), mse, max_epochs=1, run_dir=tmp_path).fit()
    assert not (tmp_path / "export").exists()


@settings(max_examples=8, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=4), st.booleans())
def test_best_export_equals_the_best_checkpoint(
        tmp_path_factory: pytest.TempPathFactory, values: list[float], maximise: bool) -> None:
    """Beside the best checkpoint, best/<name>.safetensors holds that checkpoint's weights,
    whichever epoch was best."""
    run_dir = tmp_path_factory.mktemp("run")
    saver = MaxSaver("val/loss") if maximise else MinSaver()
    _fit(run_dir, Feed(values), saver, epochs=len(values))
    best = run_dir / "best" / saver.filename
    exported = load_file(best.with_suffix(".safetensors"))
    assert _same(exported, read_checkpoint(best, map_location="cpu")["model"])
    with safe_open(best.with_suffix(".safetensors"), framework="pt") as f:
        assert int(f.metadata()["step"]) == saver.best_step


def test_tied_weights_are_exported_and_load_back(tmp_path: Path) -> None:
    """Tied weights (one storage, two names) are written, every key kept, and load into
    a fresh tied model."""
    torch.manual_seed(0)
    model = Tied()
    path = export_weights(model.state_dict(), tmp_path / "m.safetensors", step=3, epoch=1)
    loaded = load_file(path)
    assert _same(loaded, model.state_dict())
    fresh = Tied()
    fresh.load_state_dict(loaded)
    assert torch.equal(fresh.embed.weight, model.embed.weight)
    assert fresh.out.weight is fresh.embed.weight


def test_export_replaces_a_link_without_writing_through_it(tmp_path: Path) -> None:
    """A link planted where the export goes is replaced; its target is untouched."""
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep")
    link = tmp_path / "m.safetensors"
    link.symlink_to(target)
    export_weights({"w": torch.ones(2)}, link, step=1, epoch=0)
    assert target.read_text() == "keep" and not link.is_symlink()
    assert torch.equal(load_file(link)["w"], torch.ones(2))


def test_non_tensor_state_is_refused_by_name(tmp_path: Path) -> None:
    """A state entry that is not a tensor is refused, naming the entry."""
    with pytest.raises(ExportError, match="'extra'"):
        export_weights({"w": torch.ones(1), "extra": 3}, tmp_path / "m.safetensors",
                       step=1, epoch=0)


def test_missing_package_names_the_extra(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without safetensors installed the error names the extra to install."""
    real = builtins.__import__

    def no_safetensors(name: str, *args: Any, **kw: Any) -> Any:
        if name.startswith("safetensors"):
            raise ImportError(name)
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_safetensors)
    with pytest.raises(ExportError, match=r"schedtrain\[export\]"):
        export_weights({"w": torch.ones(1)}, tmp_path / "m.safetensors", step=1, epoch=0)


@pytest.mark.parametrize(("export", "message"), [
    (["onnx"], "'onnx'"), ("safetensors", "`export`: expected a list")])
def test_trainer_refuses_a_bad_export(export: Any, message: str) -> None:
    """``Trainer(export=...)`` refuses an unknown format or a bare string by name."""
    model, opt = tiny_model()
    with pytest.raises(ValueError, match=message):
        Trainer(model, opt, UnevenData([3]), mse, max_epochs=1, export=export)


def test_check_refuses_an_unknown_format_with_its_key_path(tmp_path: Path) -> None:
    """``schedtrain check`` exits 2 naming ``run.export[0]`` and no traceback."""
    spec = tmp_path / "s.toml"
    spec.write_text('[run]\ntask = "m:f"\nmax_epochs = 1\nexport = ["safetensor"]\n'
                    '[callbacks.a]\ntype = "ModelSaver"\n')
    r = subprocess.run([sys.executable, "-m", "schedtrain", "check", str(spec)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2
    assert "run.export[0]" in r.stderr + r.stdout and "safetensors" in r.stderr + r.stdout
    assert "Traceback" not in r.stderr


def test_transformers_loads_an_exported_model(tmp_path: Path) -> None:
    """A tiny Hugging Face model's weights exported this way load with
    ``from_pretrained`` (no schedtrain, no pickle)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=11,
                                     n_positions=8)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    config.save_pretrained(tmp_path)
    export_weights(model.state_dict(), tmp_path / "model.safetensors", step=1, epoch=0)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path)
    assert _same(loaded.state_dict(), model.state_dict())


def test_overwrite_removes_the_previous_runs_export(tmp_path: Path) -> None:
    """``overwrite`` starts afresh: the export folder of the run before goes too."""
    _fit(tmp_path)
    model, opt = tiny_model()
    Trainer(model, opt, UnevenData([3]), mse, max_epochs=1, run_dir=tmp_path,
            overwrite=True).fit()
    assert not (tmp_path / "export").exists()
