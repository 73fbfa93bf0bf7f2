#!/usr/bin/env bash
# The checks that need a CUDA GPU. GPU_CHECK_STEPS picks which (default: all; one call of the device tool
# has 10 minutes, so run "tests exec resnet152 train", "bench" and "half" as separate calls):
#   1. tests: the gpu-marked tests (a CuPy step under an allocator that raises, graph on and off; kernels on CuPy);
#   2. exec: bench/gpu_exec.py: ResNet-50 (batch 64) and GPT-2 small (12 layers, 768 wide, seq 1024, batch 8)
#      planned at 1/2 and 1/4 of their no-swap memory, each run with `exec --check`, CUDA graph on and off:
#      step ms, host ms per step, device bytes held against the cap, max rel diff, simulated step;
#   3. resnet152: the README's first GPU plan (ResNet-152, batch 8, ga under 512 MiB), graph on and off,
#      against the 468.6 ms a step that plan took eagerly before exact memory and prepared lanes;
#   4. train: bench/training.py on CuPy: examples per second with synthetic data and with --data, a resume
#      compared bit for bit with a straight run (evaluation inside the cap included), checkpoint cost;
#   5. bench: bench/gpu_bench.py, the measured fraction and PyTorch beside it (eager, save_on_cpu,
#      checkpointing) for ResNet-50, Wide ResNet-50-2, BERT-base and GPT-2 small at 1/2, 1/4 and 1/8;
#   6. half: bench/gpu_exec.py with --precision f16: ResNet-50 and GPT-2 small at 1/2 of their f16
#      no-swap memory, `exec --check` (half kernels computing in f32 on CuPy, never run on a GPU yet).
#
# Usage: bash bench/gpu_check.sh [OUTDIR]     (results go to OUTDIR, default $OUT or /tmp/gpu_check)
#        GPU_CHECK_ON_CPU=1 PYTHON=/path/to/venv/python bash bench/gpu_check.sh OUTDIR   (the script on a CPU)
# Wheels of packages the machine lacks (lark, safetensors and ml_dtypes, which the tests import; nvidia-cudnn-frontend
# for cuDNN convolutions, without which
# they run swapdsl's own kernels and the run says so) may wait in .whl/; they are installed first. The
# project is installed (no dependencies, no index) into the Python it runs with; its C extension is
# built with that Python's setuptools and the machine's C compiler.
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
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } | tee "$out/gpu.txt"
$py -c 'import cupy, numpy; print("cupy", cupy.__version__, "numpy", numpy.__version__)' | tee -a "$out/gpu.txt"
wanted=" ${GPU_CHECK_STEPS:-tests exec resnet152 train bench half} "
want() { [[ "$wanted" == *" $1 "* ]]; }
want tests && step gpu_tests 150 $py -m pytest -q -m gpu -p no:cacheprovider "$repo/tests"
if [ -n "${GPU_CHECK_ON_CPU:-}" ]; then  # try the script itself on a machine without a GPU: tiny models, NumPy
    want exec && step exec 300 $py "$repo/bench/gpu_exec.py" --configs tiny_resnet tiny_transformer \
        --backend numpy --steps 3 --json "$out/exec.json"
    want train && step train 300 $py "$repo/bench/training.py" --steps 20 --repeats 1 --checkpoint-models mlp
    want bench && step bench 300 $py "$repo/bench/gpu_bench.py" --small --ratios 2 4 --steps 3 --budget 3 \
        --json "$out/bench.json"
    want half && step half 300 $py "$repo/bench/gpu_exec.py" --configs tiny_resnet tiny_transformer \
        --backend numpy --precision f16 --ratios 2 --steps 3 --json "$out/half.json"
    exit 0
fi
want exec && step exec 300 $py "$repo/bench/gpu_exec.py" --configs resnet50_b64 gpt2_small --ratios 2 4 \
    --steps 4 --json "$out/exec.json"
want resnet152 && step resnet152 120 $py "$repo/bench/gpu_exec.py" --configs resnet152_b8 --method ga \
    --budget 20 --steps 4 --json "$out/resnet152.json"
want train && step train 240 $py "$repo/bench/training.py" --backend cupy --steps 100 --repeats 3 \
    --checkpoint-models resnet gpt
want bench && step bench 560 $py "$repo/bench/gpu_bench.py" --ratios 2 4 8 --steps 4 --budget 8 \
    --json "$out/bench.json"
want half && step half 300 $py "$repo/bench/gpu_exec.py" --configs resnet50_b64 gpt2_small --ratios 2 \
    --precision f16 --steps 4 --json "$out/half.json"
exit 0
