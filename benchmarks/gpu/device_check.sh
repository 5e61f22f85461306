#!/usr/bin/env bash
# The GPU checks of one lent device, in one run (tool `device`, repository root, wheels in .whl/ for the few
# pure dependencies the machine lacks; see docs/benchmarks.md "GPU device check"):
#
#   1. the co-serving guard on real contention, three seeds (issue 12's GPU item): benchmarks/gpu/admission
#   2. the device codec on 2^30 bf16 elements, 1% changed: benchmarks/gpu/codec_bench.py
#   3. the tests marked `gpu` (they skip everywhere else)
#   4. issue 32's start-up and commit check: benchmarks/gpu/startup_check.py (the fork after a CUDA-runtime
#      device count fails, after the executor's NVML count it works; an in-place commit into CUDA parameters)
#
# Every step has its own time limit, so one that hangs leaves the others' results. Output under $OUT:
# admission_seed{0,1,2}.json, codec.json, gpu_tests.txt, startup.json, log.txt (everything on stderr).
set -u
OUT=${OUT:-/tmp/rose-gpu-out}
mkdir -p "$OUT"
exec 2> >(tee -a "$OUT/log.txt" >&2)
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "wheel install failed" >&2; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
SRC=packages/rose-core/src:packages/rose-transfer/src:packages/rose-executor/src
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >&2
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >&2

admission() {  # seed
    PYTHONPATH=packages/rose-core/src:${PYTHONPATH:-} timeout 150 python3 -m benchmarks.gpu.admission \
        --seed "$1" --max-total-s 110 > "$OUT/admission_seed$1.stdout"
    echo "admission seed $1: rc=$?" >&2
    head -1 "$OUT/admission_seed$1.stdout" > "$OUT/admission_seed$1.json"
    tail -n +2 "$OUT/admission_seed$1.stdout" >&2
    rm -f "$OUT/admission_seed$1.stdout" "$OUT/gpu_admission.json"
}

PYTHONPATH=$SRC:${PYTHONPATH:-} timeout 240 python3 benchmarks/gpu/startup_check.py > "$OUT/startup.json"
echo "startup check: rc=$?" >&2
cat "$OUT/startup.json" >&2
admission 0
timeout 120 python3 benchmarks/gpu/codec_bench.py --block-sweep 1024,2048,4096,16384 > "$OUT/codec.json"
echo "codec bench: rc=$?" >&2
rm -f "$OUT/gpu_codec.json"
PYTHONPATH=$SRC:${PYTHONPATH:-} timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/transfer/test_cuda_codec.py tests/executor/test_gpu_admission_bench.py > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests: rc=$?" >&2
tail -5 "$OUT/gpu_tests.txt" >&2
admission 1
admission 2
echo "device check done" >&2
