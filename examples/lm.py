"""A real token-scheduled task: a character-level language model on Python's own source.

Used by ``specs/lm_tokens.toml`` as ``task = "examples.lm:make_task"``; run from the
repository root::

    schedtrain train specs/lm_tokens.toml

The run directory (``runs/lm_tokens``) then holds the run, so the same command again is
refused: add ``--overwrite`` to start over, or ``--resume auto`` to continue it.
``python examples/lm.py`` only imports the module (it runs nothing).

No download: the corpus is the standard library's top-level ``*.py`` files (found with
``sysconfig.get_paths()["stdlib"]``), read in sorted name order and cut to
``corpus_chars`` characters, so every machine with the same Python builds the same
corpus. Characters outside tab, newline and printable ASCII share one id.

Each batch is an ``LMBatch(inputs, targets)`` pair whose ``num_tokens`` (the characters
it predicts) the loop adds to the clock's ``token`` counter. The model's logits are
``(batch * seq_len, vocab)`` and the targets are flattened to match, so each predicted
character is one classification: plain ``cross_entropy`` is the per-character loss, and
``InferenceRunner``'s ``val/loss`` and ``val/accuracy`` are the per-character mean loss
(nats) and the next-character accuracy.
"""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

from schedtrain.callbacks import Callback
from schedtrain.training import Task

__all__ = ["VOCAB", "BitsPerChar", "CharModel", "LMBatch", "PrintLoss", "encode",
           "make_task", "read_corpus"]

#: tab, newline and printable ASCII; id ``len(VOCAB)`` stands for every other character
VOCAB = "\t\n" + "".join(chr(c) for c in range(32, 127))
_IDS = {ch: i for i, ch in enumerate(VOCAB)}


class LMBatch(NamedTuple):
    """``inputs``: ``(batch, seq_len)`` character ids; ``targets``: the characters that
    follow, flattened to ``(batch * seq_len,)``."""

    inputs: torch.Tensor
    targets: torch.Tensor

    @property
    def num_tokens(self) -> int:
        """Characters predicted: what the batch adds to the clock's ``token`` counter."""
        return self.targets.numel()


def read_corpus(chars: int) -> str:
    """The first ``chars`` characters of the stdlib's top-level modules, in name order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= chars:
            return "".join(parts)[:chars]
    raise ValueError(f"corpus_chars={chars}: the standard library at {root} has only "
                     f"{total} characters of top-level modules")


def encode(text: str) -> torch.Tensor:
    """Character ids of ``text`` (int64); other characters map to ``len(VOCAB)``."""
    other = len(VOCAB)
    return torch.tensor([_IDS.get(ch, other) for ch in text], dtype=torch.long)


def _collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> LMBatch:
    inputs, targets = default_collate(items)
    return LMBatch(inputs, targets.flatten())


def _loader(ids: torch.Tensor, seq_len: int, batch_size: int, *,
            shuffle: bool) -> DataLoader[Any]:
    # Non-overlapping windows of seq_len + 1 characters: targets are inputs shifted by one.
    n = (len(ids) - 1) // seq_len
    x = ids[:n * seq_len].view(n, seq_len)
    y = ids[1:n * seq_len + 1].view(n, seq_len)
    # drop_last in training: every batch has batch_size * seq_len tokens, so the spec's
    # [clock] tokens_per_batch describes the run exactly.
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle,
                      drop_last=shuffle, collate_fn=_collate)


class CharModel(nn.Module):
    """Embedding, a GRU and a linear read-out: logits ``(batch * seq_len, vocab)``."""

    def __init__(self, vocab: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(ids))
        logits: torch.Tensor = self.head(out)
        return logits.flatten(0, 1)


class BitsPerChar(Callback):
    """Put ``val/bpc`` (bits per character) from the latest ``val/loss`` (nats).

    Give it the validation's trigger and declare it after the validation callback.
    """

    needs = ("val/loss",)
    produces = ("val/bpc",)

    def _trigger(self) -> None:
        self.metrics.put("val/bpc", self.metrics.value("val/loss") / math.log(2))


class PrintLoss(Callback):
    """Print the clock's tokens and the mean training loss since the last print."""

    needs = ("train/loss",)

    def _trigger(self) -> None:
        if self.is_chief:
            now = self.now
            print(f"tokens {now.token:>9,}  step {now.step:>4}  "
                  f"train/loss {self.metrics.value('train/loss'):.3f}", flush=True)


def make_task(*, corpus_chars: int = 400_000, val_fraction: float = 0.1,
              seq_len: int = 128, batch_size: int = 32, dim: int = 64, hidden: int = 256,
              lr: float = 3e-3, threads: int | None = 1) -> Task:
    """The character GRU, Adam, shuffled training windows and a fixed validation tail.

    Args:
        corpus_chars: characters of stdlib source to use; the last ``val_fraction`` of
            them validate.
        val_fraction: share of the corpus held out for validation.
        seq_len: characters per window (the tokens of one sample).
        batch_size: windows per training batch.
        dim: embedding size.
        hidden: GRU state size.
        lr: Adam's learning rate.
        threads: ``torch.set_num_threads`` for the CPU; the GRU's small products gain
            little from more threads and lose much when the cores are shared (measured:
            4x slower with 2 threads on 2 busy cores). ``None`` keeps torch's default.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction}: expected a share between 0 and 1")
    if threads is not None:
        torch.set_num_threads(threads)
    ids = encode(read_corpus(corpus_chars))
    n_val = int(len(ids) * val_fraction)
    train = _loader(ids[:-n_val], seq_len, batch_size, shuffle=True)
    val = _loader(ids[-n_val:], seq_len, 256, shuffle=False)
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f"corpus_chars={corpus_chars}: too few characters for one training "
                         f"batch of {batch_size} x {seq_len} and one validation window")
    model = CharModel(len(VOCAB) + 1, dim, hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    return Task(model, optimizer, train, val, loss_fn=nn.functional.cross_entropy)
