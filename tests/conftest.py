"""Shared test configuration: helper modules importable from every test folder, and a
fast hypothesis profile for CI."""

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import HealthCheck, settings

# Test files live in one folder per package (tests/core/, tests/training/, ...); the helper
# modules (training_helpers, strategies, oracle, jobs/, ...) stay here, imported by their
# bare name from any folder. pytest's default import mode puts this folder on sys.path
# too, but only because it has no __init__.py; saying it here keeps the helpers
# importable under any import mode. Test folders have no __init__.py either, so every
# test file's basename is unique (tests/docs/test_layout.py checks that).
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

#: s3_endpoint / s3_bucket: a moto S3 server on loopback (tests/s3_server.py); the gpu
#: marker and CI's rule that nothing else skips (tests/no_skips.py); the `project` of
#: the first-day tests, a folder with a small task module (tests/first_day_project.py)
pytest_plugins = ("s3_server", "no_skips", "first_day_project")


#: Folders whose every test starts real training processes (two ranks, or a run's whole
#: life): marked ``slow`` as a whole, so the fast tier (``-m "not slow"``,
#: CONTRIBUTING.md) leaves them out. Elsewhere a test says ``slow`` itself, or is named
#: in SLOW_TESTS.
SLOW_FOLDERS = ("distributed", "lifecycle")
#: Files whose every test trains a real host (Lightning, the HF Trainer, Ignite) several
#: times over: preempted, resumed and retimed runs compared with uninterrupted ones.
SLOW_FILES = (
    "integrations/test_host_control_ignite.py",
    "integrations/test_host_control_lightning.py",
    "integrations/test_host_control_transformers.py",
    "integrations/test_ignite_control.py",
    "integrations/test_transformers_control.py",
)
#: Tests by file (``name``: every parametrization; ``name[id]``: that one) that took the
#: most time outside those folders, measured with ``--durations`` (a real command in a
#: fresh process, a run killed and resumed, a subprocess pytest): marked ``slow`` here,
#: in one list, rather than in files that other work edits at the same time.
SLOW_TESTS: dict[str, tuple[str, ...]] = {
    "training/test_retime_hops.py": (
        "test_a_retime_crosses_modules_at_most_150_times",
    ),
    "callbacks/test_topk_saver.py": (
        "test_keeps_the_best_k_finite_and_the_last",
    ),
    "checkpoints/test_async_checkpoints.py": (
        "TestSameAsSync::test_non_finite_weights_get_the_same_names_and_bytes",
    ),
    "checkpoints/test_checkpoints.py": (
        "test_one_process_runs_never_import_dcp",
    ),
    "checkpoints/test_crafted_part_states.py": (
        "test_a_part_that_cannot_take_its_state_makes_the_checkpoint_damaged",
    ),
    "checkpoints/test_crafted_run_state.py": (
        "test_a_crafted_division_is_refused_by_name_or_passed_over[a million stretches]",
    ),
    "checkpoints/test_finished_tail.py": (
        "test_a_finished_run_with_checkpoints_in_a_bucket_is_not_trained_again",
    ),
    "checkpoints/test_hostile_checkpoints.py": (
        "test_a_crafted_written_list_deletes_no_foreign_file",
        "test_a_file_size_limit_during_a_background_write",
        "test_kill_9_during_a_background_write",
    ),
    "checkpoints/test_hostile_files.py": (
        "TestPlantedFolderLinks::test_the_command_line_says_it_in_one_line",
        "test_a_pickle_payload_checkpoint_is_skipped_by_name",
    ),
    "checkpoints/test_lease_readback.py": (
        "test_store_refusing_for_3_s_is_retried",
    ),
    "checkpoints/test_preempt_keep.py": (
        "test_preempt_and_resume_keep_the_unbroken_runs_files",
    ),
    "checkpoints/test_resume_chain.py": (
        "test_crashes_at_random_steps",
        "test_preemptions_at_random_steps",
    ),
    "checkpoints/test_resume_end.py": (
        "test_killed_after_the_final_checkpoint_resumes_to_the_same_end",
    ),
    "checkpoints/test_resume_gaps.py": (
        "test_a_run_killed_anywhere_resumes_to_the_same_log",
    ),
    "checkpoints/test_resume_url.py": (
        "test_resume_url_is_resume_auto_from_that_object",
        "test_other_urls_and_missing_objects_refused",
    ),
    "checkpoints/test_retention.py": (
        "TestModelSaver::test_epoch_rules_on_a_step_grid",
    ),
    "checkpoints/test_retention_change.py": (
        "test_applied_change_in_a_bucket",
        "test_the_refusal_lists_the_files_the_change_deletes",
    ),
    "checkpoints/test_storage.py": (
        "test_local_runs_never_import_fsspec",
    ),
    "checkpoints/test_storage_run.py": (
        "test_crash_and_preempt_resume_from_bucket_exactly",
    ),
    "cli/test_check_like_train.py": (
        "test_train_imports_custom_triggers",
    ),
    "core/test_custom_trigger.py": (
        "TestExample::test_the_script_runs",
    ),
    "core/test_due_book.py": (
        "test_a_group_shares_an_entry_and_is_reached_as_each_alone",
    ),
    "docs/test_compat.py": (
        "test_old_path_is_the_new_module_and_warns",
    ),
    "docs/test_fast_tier.py": (
        "test_the_fast_tier_leaves_out_what_contributing_says",
    ),
    "docs/test_import_cost.py": (
        "test_check_and_plan_run_without_torch_or_structlog",
        "test_the_trainer_imports_rare_parts_only_when_used",
    ),
    "docs/test_test_folders.py": (
        "test_helpers_import_by_name_from_every_folder",
    ),
    "integrations/test_host_agreement_table.py": (
        "TestKilledAndResumed::test_transformers",
    ),
    "integrations/test_hosted_transformers.py": (
        "TestResume::test_kill_and_resume_keeps_state",
    ),
    "integrations/test_integrations_ranks.py": (
        "test_driver_under_torch_distributed",
        "test_ignite_idist",
        "test_lightning_ddp",
        "test_no_collective_on_a_quiet_step",
        "test_transformers_agrees_nothing_the_trainer_agreed",
        "test_transformers_ddp",
    ),
    "integrations/test_integrations_transformers.py": (
        "TestAgainstSimulation::test_firings_equal_simulation",
        "TestAgainstSimulation::test_resume_fires_as_the_uninterrupted_run",
    ),
    "integrations/test_integrations_transformers_flow.py": (
        "TestKeep::test_kept_files_are_the_policys",
        "TestMetricTiming::test_saves_equal_simulation",
        "TestStrategies::test_at_most_once_a_step",
    ),
    "integrations/test_integrations_transformers_shapes.py": (
        "TestUnevenShapes::test_firings_equal_simulation",
    ),
    "monitors/test_progress_lines.py": (
        "test_command_line_progress",
    ),
    "simulation/test_coverage_xdist.py": (
        "TestUnderXdist::test_a_gap_fails_the_session_and_reads_as_without_n",
        "TestUnderXdist::test_a_worker_that_sent_nothing_makes_the_report_incomplete",
        "TestUnderXdist::test_without_a_gap_the_session_passes",
    ),
    "spec/test_spec_fuzz.py": (
        "test_mutated_specs_end_in_ok_or_short_refusals",
    ),
    "spec/test_task_lookup.py": (
        "test_a_miss_says_where_it_looked",
        "test_a_misspelt_function_or_submodule_is_suggested",
        "test_a_module_that_fails_to_import_is_not_a_miss",
        "test_found_from_any_folder",
        "test_train_finds_the_module_next_to_the_spec",
    ),
    "training/test_lm_job.py": (
        "TestShortRun::test_firings_equal_plan",
    ),
    "training/test_notice_step.py": (
        "test_a_signal_preempts_at_its_step_with_the_deadline_triggers",
        "test_before_deadline_fires_at_the_notice_step",
    ),
    "training/test_preempt_notice.py": (
        "test_a_trickling_server_never_hides_a_later_notice",
    ),
    "training/test_retime_command.py": (
        "test_a_job_ending_is_said_to_be_ending",
        "test_a_job_starting_up_is_said_to_be_starting_and_waited_for",
        "test_the_diff_is_told_from_the_step_the_answer_gives",
    ),
    "training/test_run_dir.py": (
        "TestLock::test_a_second_process_is_refused_at_once",
    ),
    "training/test_run_files.py": (
        "TestTaskFactories::test_the_run_is_refused",
    ),
    "training/test_threads.py": (
        "test_train_sets_threads_unless_told",
    ),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow = {f"tests/{path}::{name}" for path, names in SLOW_TESTS.items() for name in names}
    files = {f"tests/{path}" for path in SLOW_FILES}
    for item in items:
        folder = item.path.parent
        if ((folder.name in SLOW_FOLDERS and folder.parent == Path(_TESTS))
                or item.nodeid.split("::", 1)[0] in files
                or item.nodeid in slow or item.nodeid.split("[", 1)[0] in slow):
            item.add_marker(pytest.mark.slow)
    # The slow tests first (a stable sort: each group keeps its order): with pytest-xdist's
    # work stealing (pyproject's addopts) a worker left idle at the end takes short tests
    # from the other's queue, so the run does not end waiting on one long test started last.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """No collector pass while the test modules import: each walks torch's heap (tens of
    thousands of objects), a fifth of a worker's collection time; the one collection
    below frees what collecting left."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What every test module imported (torch, Lightning, transformers, hypothesis) is left
    out of the garbage collector's walks: hosts that collect on purpose (HF's Trainer
    ends each ``train()`` with ``gc.collect()``) otherwise walk the whole heap each time,
    a quarter of a tiny run's time. Cycles made by the tests are collected as before."""
    gc.collect()
    gc.freeze()


def _fsync_skipped(fd: int) -> None:
    """``os.fsync`` where a test asks for ``no_fsync``."""


@pytest.fixture
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.fsync`` does nothing for the test, in its process and the processes it forks.
    An fsync makes a write survive the machine's crash or a power cut, which no test
    makes (a killed process loses nothing the kernel has); on this project's CI disk each
    costs 5-20 ms, and a run that saves every step calls it several times a save. Asked
    for by the files whose runs save many times (``pytestmark``)."""
    monkeypatch.setattr(os, "fsync", _fsync_skipped)


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """The CLI configures structlog globally; keep one test's setup out of the next."""
    yield
    structlog.reset_defaults()


settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
