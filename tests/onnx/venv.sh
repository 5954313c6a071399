#!/bin/sh
# The Python that tests/onnx/run.sh needs: a virtual environment, build/onnx-venv (or
# $ONNX_VENV), with onnx, onnxruntime and numpy from PyPI (make onnx-venv; CI's stage onnx). Kept
# when it already imports them; pip caches nothing (--no-cache-dir): the environment under
# build/ is all that is kept. Versions pinned; if those cannot be installed, the newest ones
# are tried. When nothing installs: exit 0 and run.sh skips, showing why from $ONNX_VENV.log;
# with CI=true exit 1 (CI's onnx stage fails: it would have run nothing).
set -eu
cd "$(dirname "$0")/../.." || exit 2
v=${ONNX_VENV:-build/onnx-venv}
pins="onnx==1.23.2 onnxruntime==1.32.0 numpy==2.4.6"
if "$v/bin/python" -c 'import onnx, onnxruntime, numpy' >/dev/null 2>&1; then
    echo "onnx-venv: $v has onnx, onnxruntime and numpy"
    exit 0
fi
t0=$(date +%s)
rm -rf "$v"
mkdir -p "$(dirname "$v")"
rc=0
{
    python3 -m venv "$v" &&
    { "$v/bin/pip" install --no-cache-dir -q $pins ||
      { echo "onnx-venv: the pinned versions ($pins) failed; trying the newest"
        "$v/bin/pip" install --no-cache-dir -q onnx onnxruntime numpy; }; } &&
    "$v/bin/python" -c 'import onnx, onnxruntime, numpy'
} >"$v.log" 2>&1 || rc=$?
if [ $rc -eq 0 ]; then
    echo "onnx-venv: $v made in $(( $(date +%s) - t0 )) s: $("$v/bin/python" -c 'import onnx, onnxruntime, numpy; print("onnx", onnx.__version__, "onnxruntime", onnxruntime.__version__, "numpy", numpy.__version__)')"
else
    echo "onnx-venv: could not install onnx, onnxruntime and numpy (see $v.log): $(tail -n 1 "$v.log")"
    rm -rf "$v"
    if [ "${CI:-}" = true ]; then echo "onnx-venv: CI=true: failing (the onnx stage cannot run its tests)"; exit 1; fi
fi
exit 0
