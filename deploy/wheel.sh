#!/usr/bin/env bash
# meridian's wheel, the one way it is built: `make wheel` (for a host's venv, see
# README.md, Deploy) and deploy/image/build.sh (for the image) both run this.
#
#   deploy/wheel.sh PYTHON DIST
#
# PYTHON: a Python with pip (the project's venv); DIST: the directory the wheel goes
# to (an older meridian wheel there is replaced). Prints the wheel's path.
#
# The BPF objects are build output (make bpf, git-ignored), and setuptools packs
# whatever src/meridian/bpfobj/ holds, nothing at all included: so the wheel itself
# is checked against bpf/*.bpf.c, and one without an object is refused (exit 2).
# Checked here, on the wheel, and not in a setuptools hook: that checks what is
# shipped, however setuptools globbed it, and leaves the editable install of
# `make venv` (before any `make bpf`) alone.
set -euo pipefail

PY=$1
DIST=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)

mkdir -p "$DIST"
DIST=$(cd "$DIST" && pwd)
STAGE=$(mktemp -d)
OUT=$(mktemp -d)
trap 'rm -rf "$STAGE" "$OUT"' EXIT

# From a copy of the sources: building in the checkout would leave build/ and
# *.egg-info in it.
cp "$ROOT/pyproject.toml" "$ROOT/README.md" "$STAGE/"
tar -C "$ROOT" --exclude=__pycache__ -cf - src | tar -C "$STAGE" -xf -
"$PY" -m pip wheel -q --no-deps -w "$OUT" "$STAGE" >&2
WHEEL=$(ls "$OUT"/meridian_ebpf-*.whl)

"$PY" - "$WHEEL" "$ROOT"/bpf/*.bpf.c <<'EOF'
import sys
import zipfile
from pathlib import Path

wheel, *sources = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    sizes = {i.filename: i.file_size for i in z.infolist()}
want = [f"meridian/bpfobj/{Path(s).name.removesuffix('.c')}.o" for s in sources]
missing = [Path(w).name for w in want if not sizes.get(w)]
if missing:
    print(f"error: the wheel has no {', '.join(missing)}: run `make bpf` first", file=sys.stderr)
    sys.exit(2)
EOF

rm -f "$DIST"/meridian_ebpf-*.whl
mv "$WHEEL" "$DIST/"
echo "$DIST/$(basename "$WHEEL")"
