#!/usr/bin/env bash
# The wheels a lent GPU machine lacks, downloaded here into .whl/ (git-ignored: the device tool carries it
# by name, `carry: [".whl"]`), for bench/gpu_check.sh to install with --no-index. That machine reaches no
# package index; its image (the device tool's KINDS.md) has Python 3.12, CuPy 14.2 for CUDA 13, cuDNN 9
# (nvidia-cudnn-cu13), numpy, scipy, attrs, safetensors, ml-dtypes, pytest, hypothesis and pytest-xdist,
# and lacks lark (the parser) and cuDNN Frontend, pinned at the version runtime/vendor.py was written
# against; mpi4py and MPICH (the dist extra: 2 data-parallel ranks on one GPU); and setuptools 77 or later, which reads pyproject.toml's license as written (the project is
# installed with the machine's own build tools, --no-build-isolation). The frontend's declared needs (the CUTLASS DSL, TVM FFI) serve its DSL kernels only, which
# swapdsl does not import: left out. One version of each, for one Python (GPU_PYTHON, default 3.12; 3.11
# to try gpu_check.sh on this machine with GPU_CHECK_ON_CPU=1).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
rm -rf .whl
mkdir -p .whl
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    lark==1.3.1 nvidia-cudnn-frontend==1.32.0 "setuptools>=77" mpi4py==4.1.2 mpich==5.0.2
bytes=$(cat .whl/*.whl | wc -c)
echo "staged $(ls .whl | wc -l) wheels in .whl/: $bytes bytes (a device call carries 64 MiB with the tree)"
[ "$bytes" -lt $((48 * 1024 * 1024)) ] || { echo "error: over the 48 MiB left beside the tree" >&2; exit 2; }
