"""The batch contract of docs/training.md (first day, issue 12 C): counted samples and
tokens, moved tensors."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st


class TestBatchContract:
    """What docs/training.md says batches are: counted samples and tokens, moved tensors. (first
    day, issue 12 C)"""

    @given(st.integers(1, 6), st.integers(1, 9), st.data())
    def test_dict_batches_count_tokens(self, size: int, length: int, data: st.DataObject) -> None:
        """A dict batch counts its first tensor's rows as samples; tokens are its
        ``num_tokens`` (int or one-element tensor), else the element count of ``tokens``."""
        import torch

        from schedtrain.training.batches import count_batch

        ids = torch.zeros(size, length, dtype=torch.long)
        mask = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, 1), min_size=length,
                                                        max_size=length),
                                               min_size=size, max_size=size)))
        real = int(mask.sum())
        assert count_batch({"input_ids": ids, "attention_mask": mask,
                            "num_tokens": mask.sum()}) == (size, real)
        assert count_batch({"input_ids": ids, "num_tokens": real}) == (size, real)
        assert count_batch({"tokens": ids, "labels": ids}) == (size, size * length)
        assert count_batch({"input_ids": ids, "num_samples": 1}) == (1, 0)
        assert count_batch((ids, ids[:, 0])) == (size, 0)

    def test_loop_adds_what_batches_report(self) -> None:
        """Training on dict batches with a step function, under accumulation, the clock's
        samples and tokens are the sums the batches report."""
        import torch

        from schedtrain.training import Trainer

        g = torch.Generator().manual_seed(0)
        batches = []
        for size in (3, 5, 2, 4, 1):
            mask = (torch.rand(size, 6, generator=g) > 0.3).long()
            batches.append({"input_ids": torch.randint(0, 9, (size, 6), generator=g),
                            "attention_mask": mask, "num_tokens": mask.sum()})
        model = torch.nn.Embedding(9, 1)

        def step_fn(m: torch.nn.Module, batch: dict) -> torch.Tensor:
            out = m(batch["input_ids"]).squeeze(-1)
            return (out * batch["attention_mask"]).pow(2).mean()

        t = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), batches, step_fn=step_fn,
                    callbacks=[], max_epochs=2, grad_accum=2, handle_signals=False)
        t.fit()
        assert (t.clock.step, t.clock.batch) == (6, 10)  # 3 steps per epoch (2 + 2 + 1)
        assert t.clock.sample == 2 * sum(len(b["input_ids"]) for b in batches)
        assert t.clock.token == 2 * sum(int(b["attention_mask"].sum()) for b in batches)

    def test_to_device_moves_every_tensor(self) -> None:
        """Tensors anywhere in tuples, named tuples, lists and mappings are moved; the
        containers keep their types, other values stay as they are."""
        import collections

        import torch

        from schedtrain.training.batches import to_device

        pair = collections.namedtuple("pair", "x y")
        batch = {"a": (torch.ones(2), [torch.zeros(1), "text", 3]),
                 "b": pair(torch.ones(1), {"c": torch.ones(3)}),
                 "d": collections.defaultdict(list, e=torch.ones(1))}
        moved = to_device(batch, torch.device("meta"))
        assert moved["a"][0].is_meta and moved["a"][1][0].is_meta
        assert moved["a"][1][1:] == ["text", 3] and isinstance(moved["a"], tuple)
        assert isinstance(moved["b"], pair) and moved["b"].y["c"].is_meta
        assert moved["d"]["e"].is_meta
        assert not batch["a"][0].is_meta  # the original is left alone
