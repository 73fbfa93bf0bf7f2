#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run: the gpu-marked tests, a ga plan of a zoo model executed on
# CuPy inside its cap and compared with the reference executor, and the simulator's fidelity on CuPy.
#
# Usage: bash bench/gpu_check.sh [OUTDIR]     (logs go to OUTDIR, default $OUT or /tmp/gpu_check)
# Wheels of packages the machine lacks may wait in .whl/; they are installed first. The project is
# installed (no dependencies, no index) into the Python it runs with; its C extension is built with that
# Python's setuptools (77 or newer) and the machine's C compiler.
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$out"
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
$py -m pip install -q --no-index --no-deps --no-build-isolation . || exit 1
export PYTHONUNBUFFERED=1
repo=$PWD
step() {  # step NAME SECONDS COMMAND...: run it from /tmp (so the installed package is imported), logged
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    (cd /tmp && timeout "$limit" "$@") 2>&1 | tee "$out/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]}"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
$py -c 'import cupy, numpy, setuptools; print("cupy", cupy.__version__, "numpy", numpy.__version__, "setuptools", setuptools.__version__)'
step gpu_tests 240 $py -m pytest -q -m gpu -p no:cacheprovider "$repo/tests"
step ga_exec 150 bash -c "$py -m swapdsl optimize $repo/stdlib/models/resnet.swp -D batch=8 --memory 512MiB --budget 20 \
    -o /tmp/resnet.plan --json && $py -m swapdsl exec /tmp/resnet.plan --backend cupy --steps 3 --check"
step fidelity 200 $py "$repo/bench/fidelity.py" --backend cupy --steps 7 --method ga --budget 8
