#!/usr/bin/env bash
# The trainer-side GPU check (issue 31): bf16 train steps of a random Qwen3-1.7B-shaped model at
# 8k and 32k tokens, packed vs padded, chunked vs full logits, with sdpa (dense mask) and flex
# attention (block mask); tokens/s and peak memory against the analytic prediction. Needs only
# torch and transformers (the lent GPU machine has no vLLM, Ray or network) and at most 10
# minutes on one H100/H200. Results: docs/scale.md ("Trainer on one GPU").
#   bash scripts/gpu-check.sh [OUT_DIR]        (default: $OUT, else ./gpu-check-out)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-check-out}}"
mkdir -p "$out"
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && py=.venv/bin/python
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true; } | tee "$out/nvidia-smi.txt"
check() {  # NAME SECONDS ARGS...
    local name=$1 seconds=$2; shift 2
    timeout "$seconds" "$py" -m conveyor.trainer.gpu_check --out "$out/$name.json" "$@" 2>&1 | tee "$out/$name.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
}
rc=0
# sdpa: every layout x logits pair at 8k and 32k (~80 s on an H200)
check sdpa 240 --tokens 8192,32768 --budget-s 200
# flex attention: packed vs padded at 32k, chunked logits (kernel compiles on the first step)
check flex 200 --attn flex_attention --tokens 32768 --logits chunked --budget-s 150
# one 64k packed set, chunked only (full logits there need ~130 GiB)
check flex-64k 140 --attn flex_attention --tokens 65536 --layouts packed --logits chunked --budget-s 100
exit "$rc"
