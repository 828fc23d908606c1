#!/usr/bin/env bash
# The package builds (sdist and wheel), its metadata and README render on PyPI (`twine check --strict`), and the
# wheel holds every module of the source tree (a package left out of the wheel only shows once installed from it).
set -euo pipefail
cd "$(dirname "$0")/.."
pip install -q "build>=1.2" "twine>=6"
out=$(mktemp -d)
log=$(mktemp)
python -m build --outdir "$out" . > "$log" 2>&1 || { tail -30 "$log"; exit 1; }
twine check --strict "$out"/*.whl "$out"/*.tar.gz
python - "$out" <<'PY'
import pathlib, sys, zipfile

wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
packaged = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
source = {str(path) for path in pathlib.Path("trl_multiagent").rglob("*.py")}
missing = sorted(source - packaged)
if missing:
    sys.exit(f"check_package: {wheel.name} lacks {missing}")
assets = {"trl_multiagent/view/viewer.js", "trl_multiagent/view/viewer.css"}  # the viewer's page needs them
if assets - set(zipfile.ZipFile(wheel).namelist()):
    sys.exit(f"check_package: {wheel.name} lacks {sorted(assets - set(zipfile.ZipFile(wheel).namelist()))}")
print(f"check_package: {wheel.name} holds all {len(source)} modules")
PY
rm -rf "$out" "$log"
