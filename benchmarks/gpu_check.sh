#!/usr/bin/env bash
# The GPU-only checks, for a machine with CUDA: every test marked `gpu` (no host-device
# sync on steps where nothing fires, tests/training/test_training_nosync.py; pinned host copies of
# device state; device metrics). Run from anywhere: bash benchmarks/gpu_check.sh [pytest args]
# With CUDA a skip fails (SCHEDTRAIN_NO_SKIPS=1); without it each test skips, and this says so.
set -euo pipefail
cd "$(dirname "$0")/.."

python - <<'PY'
import torch

if torch.cuda.is_available():
    print(f"CUDA: {torch.cuda.get_device_name(0)} (torch {torch.__version__})")
else:
    print(f"CUDA: not available (torch {torch.__version__}): the gpu tests are skipped, "
          "nothing on a GPU is checked")
PY
# Only the files that mark a test gpu: collecting the whole suite takes longer than the checks.
mapfile -t files < <(grep -l "mark\.gpu" tests/*/test_*.py)
SCHEDTRAIN_NO_SKIPS=1 exec python -m pytest -m gpu -rs -q "${files[@]}" "$@"
