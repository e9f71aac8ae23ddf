#!/usr/bin/env bash
# What a GPU node runs of this project: the `gpu` tests, then benchmarks/park_cuda.py
# as a worker parks (exact pinned blocks where torch takes them) and, at one size,
# with torch's rounded blocks. Run from the
# repository root with the node's python3 (torch with CUDA, nvidia-ml-py); logs and JSON
# go to $OUT (default ./gpu-out). docs/benchmarks.md quotes the last run.
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)" \
    | tee -a "$OUT/gpu.txt"
timeout 240 $PY -m pytest -m gpu -p no:cacheprovider -v -s \
    tests/unit/worker/test_worker_cuda.py tests/unit/worker/test_worker_offload.py \
    tests/unit/worker/test_worker_backends.py 2>&1 | tee "$OUT/gpu-tests.log"
tests=$?
timeout 180 $PY benchmarks/park_cuda.py \
    --sizes "${SIZES:-256,1024,2048}" --repeats 3 --json "$OUT/park_cuda.json" 2>&1 \
    | tee "$OUT/park_cuda.log"
timeout 80 $PY benchmarks/park_cuda.py --sizes 1024 --repeats 3 --no-pin-exactly \
    --json "$OUT/park_cuda_default_alloc.json" 2>&1 | tee "$OUT/park_cuda_default_alloc.log"
exit $tests
