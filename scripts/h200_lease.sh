#!/usr/bin/env bash
# One lease of the lent H200 for the llama.cpp ground truth (docs/llamacpp.md).
#   bash scripts/h200_lease.sh start [DEADLINE_S [GRID]]  # install carried wheels, start the lease in the background, collect
#   bash scripts/h200_lease.sh collect [WAIT_S]    # wait for progress and pack run/ into $OUT
# Carry: .llamacpp (the `python -m calibrate.llamacpp prepare` archive) and .whl (gguf, simpy).
set -uo pipefail
mode=${1:-collect}
arg=${2:-}
: "${OUT:?OUT is not set (the device tool sets it)}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || { echo "wheel install failed"; exit 2; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if [ "$mode" = start ]; then
  # the work folder goes where the most disk is free (the GGUFs need ~45 GB)
  W=$(python3 -c "import shutil;c=['/root','/tmp','/var/tmp'];print(max(c,key=lambda p:shutil.disk_usage(p).free))")/psim-lease
  echo "$W" > /tmp/psim-work-path
  df -h / /root /tmp "$PWD" 2>/dev/null | sort -u; free -g | head -2; nvidia-smi -L
  python3 -m calibrate.llamacpp start --src .llamacpp/llama.cpp-src.tgz --work "$W" --deadline-s "${arg:-1450}" ${3:+--grid "$3"} || exit 2
  python3 -m calibrate.llamacpp collect --work "$W" --out "$OUT" --wait 500
else
  W=$(cat /tmp/psim-work-path 2>/dev/null) || { echo "no lease on this machine (it was given back?)"; exit 2; }
  python3 -m calibrate.llamacpp collect --work "$W" --out "$OUT" --wait "${arg:-560}"
fi
