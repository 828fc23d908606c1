#!/usr/bin/env bash
# The GPU check that fits the lent device: one H200, no network, torch 2.11, transformers 5.17, accelerate, peft, and
# no trl, datasets, deepspeed or vLLM. Packages reach it only as wheels, at most 64 MiB per call, so the check brings
# the small wheels it needs in call-sized bundles, and builds its models from configs (benchmarks/gpu_check.py).
#
#   bash benchmarks/gpu_check.sh --fetch         # here, with PyPI: the wheels into gpu_wheels/part_*/ (<= 56 MiB each)
#   bash benchmarks/gpu_check.sh --install DIR   # on the device, one call per bundle: into the .venv-gpu-check venv
#   bash benchmarks/gpu_check.sh                 # on the device: the check, its table in gpu_check.md (< 8 minutes)
#   bash benchmarks/gpu_check.sh --dry           # on a CPU, tiny sizes, no install: the code path, as the tests run
#
# With the device tool, each call carries one bundle (git-ignored; the working tree and the bundle travel together,
# 64 MiB in all, hence 56 MiB bundles). The venv stays on the machine between calls while it is held; naming it in
# `carry` would replace it with this machine's (absent) one:
#   carry ["gpu_wheels/part_1"]: bash benchmarks/gpu_check.sh --install gpu_wheels/part_1
#   carry ["gpu_wheels/part_2"]: bash benchmarks/gpu_check.sh --install gpu_wheels/part_2
#   carry ["gpu_wheels/part_3"]: bash benchmarks/gpu_check.sh --install gpu_wheels/part_3 && bash benchmarks/gpu_check.sh
# The vLLM checks that need a GPU are benchmarks/gpu_vllm_check.sh, for a machine with vLLM installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-gpu-check
BUNDLE_BYTES=$((56 * 1024 * 1024))
PYTHON_VERSION=${GPU_CHECK_PYTHON_VERSION:-311}  # the device's CPython, for the compiled wheels

case "${1:-}" in
--fetch)
    # What the device lacks: the installed closure of what the check imports (the package, TRL, datasets, and wandb,
    # which CoMLRL imports), pinned to what runs here, less torch, accelerate, peft and what they need (the device has
    # them); transformers comes along because the package needs >=5.19 (the device has 5.17). pip resolves nothing
    # here (--no-deps): the install on the device checks the imports, offline.
    rm -rf gpu_wheels && mkdir -p gpu_wheels/all
    pins=$(python - <<'PY'
import importlib.metadata as m
from packaging.requirements import Requirement

def closure(names):
    seen, todo = {}, list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = m.distribution(name)
        except m.PackageNotFoundError:
            continue
        seen[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen

# transformers and the libraries it pins move with it: the device's are older.
on_device = set(closure(["torch", "accelerate", "peft"])) - set(closure(["transformers"])) | {"torch", "numpy"}
needed = closure(["trl-multiagent", "trl", "datasets", "wandb", "transformers"])
print(" ".join(f"{n}=={v}" for n, v in sorted(needed.items()) if n not in on_device and n != "trl-multiagent"))
PY
)
    pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --python-version "$PYTHON_VERSION" -d gpu_wheels/all $pins comlrl==1.4.3
    pip wheel -q --no-deps -w gpu_wheels/all .
    # First-fit into bundles, largest first.
    part=0; size=$BUNDLE_BYTES
    for wheel in $(ls -S gpu_wheels/all/*.whl); do
        bytes=$(stat -c %s "$wheel")
        if [ "$bytes" -gt "$BUNDLE_BYTES" ]; then echo "gpu_check: $wheel is over one call's limit" >&2; exit 1; fi
        if [ $((size + bytes)) -gt "$BUNDLE_BYTES" ]; then part=$((part + 1)); size=0; mkdir -p "gpu_wheels/part_$part"; fi
        mv "$wheel" "gpu_wheels/part_$part/"; size=$((size + bytes))
    done
    rmdir gpu_wheels/all
    du -sh gpu_wheels/part_*
    ;;
--install)
    # A venv that sees the device's own torch, accelerate and peft; each bundle adds its wheels without the network.
    [ -x "$VENV/bin/python" ] || python -m venv --system-site-packages "$VENV"
    "$VENV/bin/python" -m pip install -q --no-index --no-deps "$2"/*.whl
    echo "gpu_check: installed $(ls "$2" | wc -l) wheels from $2"
    ;;
--dry)
    exec python benchmarks/gpu_check.py --dry "${@:2}"
    ;;
*)
    PY="$VENV/bin/python"
    [ -x "$PY" ] || { echo "gpu_check: no $VENV; run --install with each bundle first" >&2; exit 1; }
    # A module the bundles missed fails here, by name, before any work.
    "$PY" -c "import trl, datasets, comlrl, trl_multiagent; print('gpu_check: trl', trl.__version__, 'datasets', datasets.__version__)"
    "$PY" benchmarks/gpu_check.py --comlrl_python "$PY" --out gpu_check.md "$@"
    ;;
esac
