"""A run's life as one tested machine (issue 42): real runs of a tiny task driven through
random sequences of life operations (start, kill -9 anywhere, SIGTERM, SIGUSR1, a cloud
notice, a live retime, resumes as is and with a changed schedule, a requeue after the end)
with invariants checked after each (tests/lifecycle/test_run_life.py,
benchmarks/run_life.py)."""
