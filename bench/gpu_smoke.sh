#!/usr/bin/env bash
# The GPU smoke check (issue 37, point 6): the paper path on one GPU. The trainer is launched
# (torchrun, accelerate's own launcher underneath: accelerate refuses --multi_gpu for one
# process) with NCCL (distributed.backend "auto": cpu:gloo,cuda:nccl), FSDP of one rank, full
# fine-tuning in mixed precision (float32 shards, bfloat16 passes), Self-Play (agent and
# simulator both learning), a checkpoint every step, a resume (steps 1-2, then 3 from step 2's
# checkpoint) and a held-out evaluation, on a small Qwen3 built from transformers' Qwen3Config
# (random weights: nothing downloaded) and on SmolLM2 (unpacked from the pack). It prints s/step,
# trained tokens/s and each phase's peak GPU memory (<run>/memory/rank-0.json) beside the dry
# run's estimate for the same sizes; the vLLM-rollout part runs only where vllm imports, else
# it says it did not run and why. Then nvidia-smi and the commit. Made for the device tool's one
# GPU (no network, no vLLM): it reads SmolLM2 and the missing Python packages from the pack
# folder carried with the call (bench/gpu_smoke.py pack; docs/paper.md, "GPU smoke check").
#
#   bash bench/gpu_smoke.sh                       # on the lent GPU, with .gpu_smoke carried
#   DEVICE=cpu MODEL=<SmolLM2 folder> bash bench/gpu_smoke.sh   # here (gloo), a check of the script
#
# PACK (default .gpu_smoke) is the pack folder; MODEL, a Hugging Face folder to use instead of
# unpacking it; SMOKE_OUT where the runs go. REGIMES=1 also runs the older check: one step of
# every regime in process (bench/gpu_smoke.py run; DTYPE, STEPS).
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
$PY bench/gpu_smoke.py paper --device "${DEVICE:-cuda}" --out "${SMOKE_OUT:-/tmp/gpu-smoke}"
status=$?
if [ "${REGIMES:-0}" = 1 ]; then
    $PY bench/gpu_smoke.py run --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}" \
        --steps "${STEPS:-1}" --out "${SMOKE_OUT:-/tmp/gpu-smoke}/regimes" || status=1
fi
if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo "nvidia-smi: not on this machine"; fi
if [ -n "${OUT:-}" ] && [ -f "${SMOKE_OUT:-/tmp/gpu-smoke}/results.json" ]; then
    cp "${SMOKE_OUT:-/tmp/gpu-smoke}/results.json" "$OUT/gpu_smoke.json"  # the device tool's $OUT
fi
exit $status
