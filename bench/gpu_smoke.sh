#!/usr/bin/env bash
# The GPU smoke check (issue 22, point 8): one training step of every regime on SmolLM2, in
# process, on CUDA in bfloat16, with seconds per step and peak GPU memory per regime; then
# nvidia-smi and the commit. Made for the device tool's one H200 (no network, no vLLM): it reads
# SmolLM2 and the missing Python packages from the pack folder carried with the call
# (bench/gpu_smoke.py pack; docs/paper.md, "GPU smoke check", says how).
#
#   bash bench/gpu_smoke.sh                       # on the lent GPU, with .gpu_smoke carried
#   DEVICE=cpu DTYPE=float32 bash bench/gpu_smoke.sh   # here, as a check of the script
#
# PACK (default .gpu_smoke) is the pack folder; MODEL, a Hugging Face folder to use instead of
# unpacking it; STEPS (default 1) the steps per regime; SMOKE_OUT where the runs go.
set -uo pipefail
cd "$(dirname "$0")/.."
PACK=${PACK:-.gpu_smoke}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD:$PWD/platform${PYTHONPATH:+:$PYTHONPATH}"
export PARLEY_DATA_DIR=${PARLEY_DATA_DIR:-/tmp/gpu-smoke-data}
if git rev-parse HEAD >/dev/null 2>&1; then echo "commit: $(git rev-parse HEAD)"; else
    echo "commit: no .git here; the pack was made at $(cat "$PACK/COMMIT" 2>/dev/null || echo "an unknown commit")"; fi
if [ -d "$PACK/wheels" ]; then
    # --target: the device's own torch, transformers and peft stay as they are
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpu-smoke-site "$PACK"/wheels/*.whl || exit 1
    export PYTHONPATH="$PYTHONPATH:/tmp/gpu-smoke-site"
fi
if [ -z "${MODEL:-}" ]; then
    MODEL=/tmp/gpu-smoke-smollm2
    $PY bench/gpu_smoke.py unpack "$PACK" "$MODEL" || exit 1
fi
export PARLEY_BASE_MODEL=$MODEL
$PY -c "import torch, transformers, peft, accelerate; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)"
$PY bench/gpu_smoke.py run --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}" \
    --steps "${STEPS:-1}" --out "${SMOKE_OUT:-/tmp/gpu-smoke}"
status=$?
if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo "nvidia-smi: not on this machine"; fi
if [ -n "${OUT:-}" ] && [ -f "${SMOKE_OUT:-/tmp/gpu-smoke}/results.json" ]; then
    cp "${SMOKE_OUT:-/tmp/gpu-smoke}/results.json" "$OUT/gpu_smoke.json"  # the device tool's $OUT
fi
exit $status
