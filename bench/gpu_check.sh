#!/usr/bin/env bash
# The checks that need a CUDA GPU, in three calls of the device tool (about 15 minutes of device time in
# all, start-up included): GPU_CHECK_CALL=A, B or C picks one; GPU_CHECK_STEPS names steps instead.
#   A (the first call, at most 6 minutes by its steps' limits: the riskiest questions first):
#      light 90 s, tests 120 s, exec_tiny 50 s, exec_r2 100 s
#   B (5 minutes): bench 240 s (PyTorch beside it), profile 60 s
#   C (what is left, 8 minutes by its limits; or GPU_CHECK_STEPS= what failed, after a fix): exec_gpt2 150 s,
#      profile_gpt2 60 s, half 150 s, dist 150 s
#   AB: A and B in one call, since each start costs device time (on the H200, 2026-12-04, A's steps took
#      80 s of their 360; docs/benchmarks.md). Their limits add to 660 s: give the call 600 s, so that only
#      a step hung at the end is cut, and what it wrote to OUTDIR still comes back.
#   D (4.5 minutes, after a round of kernel fixes): tests, both profiles, exec_r1 (ResNet-50 and GPT-2 with no
#      swaps, graph on, no reference: the no-cap step), exec_on (the same at 1/2, graph on, checked),
#      bench_r50 (ResNet-50 at 1/2 beside PyTorch)
#   E (the next call: what has not yet run on a GPU, the riskiest first; its steps' limits add to 570 s: give
#      the call 600 s): tests (bf16 as bits, half products through cuBLAS with the scratch as its workspace,
#      host updates, the composite norm and softmax kernels), dist (2 ranks on one GPU, with and without
#      host-copy all-reduces), exec_on (the half-memory steps again, steady: 4 steps), bf16 (GPT-2 and
#      ResNet-50 at 1/2, graph on)
#   profile_gpt2: `swapdsl profile` of GPT-2 small on CuPy (in C)
#   Step times: with the graph on, step 1 runs eagerly and step 2 captures the graph (issuing every item
#      from Python, 0.1-1 s), so a steady figure needs at least 4 steps (bench/gpu_exec.py leaves both out
#      and marks a row with no steady step "(warm-up)").
#   (not in a call; by name only: exec_r4, resnet152, train, bf16)
# The steps' limits say what each may take: a step of ResNet-50 (batch 64) or GPT-2 small (batch 8, seq
# 1024) simulates at 0.1-0.3 s on an H100, but `exec --check` also runs the NumPy reference beside it,
# about 10-20 s a step on 16 cores (200-800 GFLOP a step at 30-50 GFLOP/s a core), which sets the time.
#   light: bench/gpu_first_light.py: CuPy and its accelerators off, cuBLAS under capture, cuDNN Frontend
#      graphs, `exec --check` of mlp and tiny_transformer on CuPy (a minute);
#   tests: the gpu-marked tests (a CuPy step under an allocator that raises, graph on and off; kernels on CuPy);
#   dist: 2 data-parallel ranks on CuPy under mpiexec, checked against the reference (runtime/nccl.py: on one
#      GPU, MPI through host memory, since NCCL takes one rank per GPU; NCCL itself needs two GPUs);
#   exec_tiny, exec_r2, exec_gpt2, exec_r4: bench/gpu_exec.py: tiny_resnet and tiny_transformer, ResNet-50
#      (batch 64), GPT-2 small (12 layers, 768 wide, seq 1024, batch 8) at 1/2 (or 1/4) of their no-swap
#      memory, each run with `exec --check`, CUDA graph on and off: step ms, host ms per step, device bytes
#      held against the cap, max rel diff, simulated step;
#   bench: bench/gpu_bench.py, the measured fraction and PyTorch beside it (eager, save_on_cpu,
#      checkpointing) for ResNet-50 and GPT-2 small at 1/2 and 1/4;   profile: `swapdsl profile` on CuPy;
#   half: bench/gpu_exec.py with --precision f16 (half kernels computing in f32 on CuPy, never run yet);
#   bf16: the same in bf16 (its tensors kept as bits on CuPy: graph/ops/halfbits.py; by name, 150 s; the
#      gpu tests in "tests" already run a bf16 plan and host updates on CuPy);
#   resnet152: the README's first GPU plan (ResNet-152, batch 8, ga under 512 MiB), against the 468.6 ms a
#      step it took eagerly long ago;   train: bench/training.py on CuPy (throughput, resume, checkpoints).
#
# Usage: GPU_CHECK_CALL=A|AB|B|C|D|E bash bench/gpu_check.sh [OUTDIR]   (results go to OUTDIR, default $OUT or /tmp/gpu_check)
#        GPU_CHECK_ON_CPU=1 PYTHON=/path/to/venv/python bash bench/gpu_check.sh OUTDIR   (the script on a CPU)
# The wheels the machine lacks (lark; nvidia-cudnn-frontend, without which convolutions run swapdsl's own
# kernels and the run says so) are staged here by bench/stage_wheels.sh into .whl/, carried by name, and
# installed first. The project is installed (no dependencies, no index) into the Python it runs with; its
# C extension is built with that Python's setuptools and the machine's C compiler.
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$out"
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    # MPICH's wheel keeps its libraries and mpiexec outside the Python packages, which --target drops:
    # a prefix of its own, named to mpi4py (MPI4PY_LIBMPI) and put on PATH
    for w in .whl/mpich-*.whl; do
        [ -e "$w" ] || continue
        $py -m pip install -q --ignore-installed --no-index --no-deps --no-compile --prefix /tmp/mpich "$w" || exit 1
        export PATH=/tmp/mpich/bin:$PATH MPI4PY_LIBMPI=/tmp/mpich/lib/libmpi.so.12
    done
    others=$(ls .whl/*.whl | grep -v '/mpich-')
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $others || exit 1
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
case "${GPU_CHECK_CALL:-}" in
    A) calls="light tests exec_tiny exec_r2" ;;
    AB) calls="light tests exec_tiny exec_r2 bench profile" ;;
    B) calls="bench profile" ;;
    C) calls="exec_gpt2 profile_gpt2 half dist" ;;
    D) calls="tests profile profile_gpt2 exec_r1 exec_on bench_r50" ;;
    E) calls="tests dist exec_on bf16" ;;
    *) calls="light tests exec_tiny exec_r2 exec_gpt2 bench profile half bf16 dist" ;;
esac
wanted=" ${GPU_CHECK_STEPS:-$calls} "
want() { [[ "$wanted" == *" $1 "* ]]; }
want light && step light 90 $py "$repo/bench/gpu_first_light.py" --json "$out/light.json"
want tests && step gpu_tests 120 $py -m pytest -q -m gpu -p no:cacheprovider "$repo/tests" \
    --ignore "$repo/tests/test_dataparallel.py"
want dist && step dist 150 $py -m pytest -q -m gpu -p no:cacheprovider "$repo/tests/test_dataparallel.py"
if [ -n "${GPU_CHECK_ON_CPU:-}" ]; then  # try the script itself on a machine without a GPU: tiny models, NumPy
    want exec_tiny && step exec_tiny 300 $py "$repo/bench/gpu_exec.py" --configs tiny_resnet tiny_transformer \
        --backend numpy --steps 3 --json "$out/exec.json"
    want profile && step profile 120 $py -m swapdsl profile "$repo/stdlib/models/tiny_resnet.swp" -D batch=8 \
        --backend numpy -o "$out/profile.json"
    want train && step train 300 $py "$repo/bench/training.py" --steps 20 --repeats 1 --checkpoint-models mlp
    want bench && step bench 300 $py "$repo/bench/gpu_bench.py" --small --ratios 2 4 --steps 3 --budget 3 \
        --json "$out/bench.json"
    want half && step half 300 $py "$repo/bench/gpu_exec.py" --configs tiny_resnet tiny_transformer \
        --backend numpy --precision f16 --ratios 2 --steps 3 --json "$out/half.json"
    want bf16 && step bf16 300 $py "$repo/bench/gpu_exec.py" --configs tiny_resnet tiny_transformer \
        --backend numpy --precision bf16 --ratios 2 --steps 3 --json "$out/bf16.json"
    exit 0
fi
want exec_tiny && step exec_tiny 50 $py "$repo/bench/gpu_exec.py" --configs tiny_resnet tiny_transformer \
    --steps 3 --json "$out/exec_tiny.json"
want exec_r2 && step exec_r2 100 $py "$repo/bench/gpu_exec.py" --configs resnet50_b64 --ratios 2 \
    --steps 4 --json "$out/exec_r2.json"
want exec_gpt2 && step exec_gpt2 150 $py "$repo/bench/gpu_exec.py" --configs gpt2_small --ratios 2 \
    --steps 4 --json "$out/exec_gpt2.json"
want exec_r4 && step exec_r4 300 $py "$repo/bench/gpu_exec.py" --configs gpt2_small resnet50_b64 --ratios 4 \
    --steps 4 --json "$out/exec_r4.json"
want resnet152 && step resnet152 120 $py "$repo/bench/gpu_exec.py" --configs resnet152_b8 --method ga \
    --budget 20 --steps 4 --json "$out/resnet152.json"
want train && step train 240 $py "$repo/bench/training.py" --backend cupy --steps 100 --repeats 3 \
    --checkpoint-models resnet gpt
want bench && step bench 240 $py "$repo/bench/gpu_bench.py" --models resnet50 gpt2_small --ratios 2 4 \
    --steps 4 --budget 8 --json "$out/bench.json"
want profile && step profile 60 $py -m swapdsl profile "$repo/stdlib/models/resnet.swp" -D depth=50 -D batch=64 \
    --backend cupy -o "$out/profile.json"
want profile_gpt2 && step profile_gpt2 60 $py -m swapdsl profile "$repo/stdlib/models/gpt.swp" -D layers=12 \
    -D hidden=768 -D heads=12 -D seq=1024 -D batch=8 --backend cupy -o "$out/profile_gpt2.json"
want exec_r1 && step exec_r1 90 $py "$repo/bench/gpu_exec.py" --configs resnet50_b64 gpt2_small --ratios 1 \
    --graphs on --no-check --steps 4 --json "$out/exec_r1.json"
want exec_on && step exec_on 150 $py "$repo/bench/gpu_exec.py" --configs resnet50_b64 gpt2_small --ratios 2 \
    --graphs on --steps 4 --json "$out/exec_on.json"
want bench_r50 && step bench_r50 90 $py "$repo/bench/gpu_bench.py" --models resnet50 --ratios 2 --steps 4 \
    --budget 8 --json "$out/bench_r50.json"
want half && step half 150 $py "$repo/bench/gpu_exec.py" --configs resnet50_b64 gpt2_small --ratios 2 \
    --precision f16 --graphs on --steps 4 --json "$out/half.json"
want bf16 && step bf16 150 $py "$repo/bench/gpu_exec.py" --configs resnet50_b64 gpt2_small --ratios 2 \
    --precision bf16 --graphs on --steps 4 --json "$out/bf16.json"
exit 0
