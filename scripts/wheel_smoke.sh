#!/usr/bin/env bash
# The package as a user installs it: build the wheel, install it into a fresh virtual environment
# outside the checkout, and from another directory train 2 steps and print a plan with the
# installed commands. Run from the checkout with its environment active (.ci/run does).
#
# The new environment sees the checkout environment's packages through one .pth line (torch,
# Lightning, ...: nothing is fetched again) but not its editable lightning_dist: a .pth inside a
# folder that a .pth line adds is not read, so the only lightning_dist it imports is the wheel's.
set -euo pipefail
checkout=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Built from the committed tree in a folder of its own: a stale build/ in the checkout cannot
# slip old files into the wheel.
mkdir "$work/src" && git archive HEAD | tar -x -C "$work/src"
python -m pip wheel --quiet --no-deps --no-build-isolation -w "$work/wheel" "$work/src"
python -m venv "$work/venv"
deps=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps" > "$site/checkout_environment.pth"
"$work/venv/bin/python" -m pip install --quiet --no-deps "$work"/wheel/*.whl
mkdir "$work/elsewhere" && cd "$work/elsewhere"
"$work/venv/bin/python" - "$work/venv" "$checkout" <<'PY'
import sys
import lightning_dist
where = lightning_dist.__file__
assert where.startswith(sys.argv[1]) and not where.startswith(sys.argv[2]), where
print(f"wheel: lightning_dist {lightning_dist.__version__} imported from {where}")
PY
"$work/venv/bin/lightning-dist-train" debug=fast trainer.max_steps=2 hydra.run.dir=run
test -s run/summary.json
"$work/venv/bin/lightning-dist-plan" model=llama3_8b hardware=dgx_h100 --top 3
echo "wheel: train (2 steps) and plan ran from $work/elsewhere"
