"""``[run] seed`` on the first day (issue 12 C): one seed, one run."""

from __future__ import annotations

from pathlib import Path

from first_day_project import spec


class TestSeed:
    """``[run] seed`` seeds before the task builds its model: one seed, one run. (first day, issue
    12 C)"""

    def _run(self, project: Path, seed: int, run_dir: str) -> tuple[dict, dict]:
        import copy

        import torch

        from schedtrain.spec import load_spec
        from schedtrain.training import Task, train_from_spec

        module = __import__((project / "module_name").read_text())
        built: list[Task] = []
        original = module.make_task

        def recording() -> Task:
            task = original()
            built.append(copy.deepcopy(task.model.state_dict()))
            return task

        module.recording = recording
        path = spec(project, f"""
            [run]
            task = "MODULE:recording"
            max_epochs = 2
            device = "cpu"
            seed = {seed}
            [callbacks.validate]
            type = "InferenceRunner"
            trigger = {{ every = "1 epoch" }}
            """, name=f"{run_dir}.toml")
        trainer = train_from_spec(load_spec(path), run_dir, None)
        final = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        assert all(isinstance(v, torch.Tensor) for v in final.values())
        return built[0], final

    def test_same_seed_same_run(self, project: Path) -> None:
        """Two runs with one seed have bit-identical initial and final weights; another
        seed gives other initial weights."""
        import torch

        init_a, final_a = self._run(project, 5, "a")
        init_b, final_b = self._run(project, 5, "b")
        init_c, _ = self._run(project, 6, "c")
        for k in init_a:
            assert torch.equal(init_a[k], init_b[k]) and torch.equal(final_a[k], final_b[k])
            assert not torch.equal(init_a[k], final_a[k])  # it trained
        assert any(not torch.equal(init_a[k], init_c[k]) for k in init_a)
