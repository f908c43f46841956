#!/usr/bin/env bash
# Host-buffer experiment (docs/llamacpp.md, "What drives the misses"): does the CPU backend run
# host-resident weights slower from llama.cpp's pinned CUDA_Host buffers (-lm none, the
# default of the ground truth) than from plain CPU buffers (--no-host 1)? Builds llama-bench,
# writes the three synthetic GGUFs in parallel, then runs the decode rows whose weights the
# CPU reads (Gemma -ngl 31 and FFN on the CPU, gpt-oss -ncmoe 24, Qwen3 -ncmoe 48) with
# --no-host 0,1. A hard deadline keeps it inside one device call. Writes under $OUT.
#   bash scripts/h200_nohost.sh      (carry .llamacpp and .whl)
set -uo pipefail
: "${OUT:?OUT is not set (the device tool sets it)}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
W=/root/nohost; mkdir -p "$W" "$OUT/logs"
T0=$(date +%s); say() { echo "$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/progress.log"; }
DEADLINE=${DEADLINE:-540}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -i "model name\|^CPU(s)\|L3"
  echo "thp enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
  echo "thp defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null)"; } > "$OUT/machine.txt"
for m in gemma3-27b gpt-oss-20b qwen3-30b-a3b; do
  python3 -m calibrate.llamacpp.gguf_writer --model scenarios/models/$m.toml --out "$W/$m.gguf" --seed 0 > "$OUT/logs/gguf-$m.log" 2>&1 &
done
python3 -m calibrate.llamacpp build --src .llamacpp/llama.cpp-src.tgz --work "$W/b" --targets llama-bench > "$OUT/logs/build.log" 2>&1
say "build exit $?"
B=$(find "$W/b" -name llama-bench -type f | head -1)
wait; say "gguf writers done"
run() {  # id, seconds limit, llama-bench args...
  local id=$1 lim=$2; shift 2
  local left=$(( DEADLINE - ($(date +%s) - T0) ))
  [ "$left" -lt 25 ] && { say "$id: skipped (deadline)"; return; }
  [ "$lim" -gt "$left" ] && lim=$left
  timeout "$lim" "$B" -v "$@" -o jsonl > "$OUT/$id.jsonl" 2> "$W/$id.err"; say "$id exit $? ($(wc -l < "$OUT/$id.jsonl") rows)"
  grep -E "buffer size|repack|REPACK" "$W/$id.err" > "$OUT/logs/$id.buffers.txt"
}
run gemma-ngl31-tg 110 -m "$W/gemma3-27b.gguf" -ngl 31 -lm none -fa 1 -b 2048 -ub 512 -p 0 -n 16 -r 5 --no-host 0,1
run gptoss-ncmoe24-tg 80 -m "$W/gpt-oss-20b.gguf" -ngl 99 -ncmoe 24 -lm none -fa 1 -b 2048 -ub 512 -p 0 -n 64 -r 5 --no-host 0,1
run qwen3-ncmoe48-tg 80 -m "$W/qwen3-30b-a3b.gguf" -ngl 99 -ncmoe 48 -lm none -fa 1 -b 2048 -ub 512 -p 0 -n 64 -r 5 --no-host 0,1
run gemma-ffn-cpu-tg 110 -m "$W/gemma3-27b.gguf" -ngl 99 -ot "ffn_(gate|up|down)=CPU" -lm none -fa 1 -b 2048 -ub 512 -p 0 -n 16 -r 3 --no-host 0,1
say done
