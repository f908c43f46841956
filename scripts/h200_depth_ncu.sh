#!/usr/bin/env bash
# Diagnostic lease (docs/llamacpp.md, "What drives the misses": decode at depth): build
# llama-bench, write the Qwen3-30B-A3B GGUF in parallel, then ncu kernel times of fully resident
# decode at depth 0 and 8192 (-fa 1, CUDA graphs off so ncu sees every kernel). Writes under $OUT.
#   bash scripts/h200_depth_ncu.sh      (carry .llamacpp and .whl)
set -uo pipefail
: "${OUT:?OUT is not set (the device tool sets it)}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
W=/root/depth; mkdir -p "$W" "$OUT/logs"
T0=$(date +%s); say() { echo "$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/progress.log"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -m calibrate.llamacpp.gguf_writer --model scenarios/models/qwen3-30b-a3b.toml --out "$W/qwen3.gguf" --seed 0 > "$OUT/logs/gguf.log" 2>&1 & P1=$!
python3 -m calibrate.llamacpp build --src .llamacpp/llama.cpp-src.tgz --work "$W/b" --targets llama-bench > "$OUT/logs/build.log" 2>&1
say "build exit $?"
B=$(find "$W/b" -name llama-bench -type f | head -1)
wait $P1; say "gguf exit $?"
M=$W/qwen3.gguf
NCU="ncu --csv --page raw --metrics gpu__time_duration.sum --cache-control none --clock-control none --launch-count 14000"
for d in 0 8192; do
  GGML_CUDA_DISABLE_GRAPHS=1 timeout 150 $NCU --log-file "$W/ncu-d$d.csv" "$B" -m "$M" -ngl 99 -ncmoe 0 -lm none -fa 1 -b 2048 -ub 2048 -p 0 -n 4 -d $d -r 1 --no-warmup -o jsonl > "$OUT/ncu-d$d.jsonl" 2>"$W/ncu-d$d.err"; say "ncu d$d exit $?"
  gzip -c "$W/ncu-d$d.csv" > "$OUT/ncu-qwen3-tg-d$d.csv.gz"
done
timeout 120 "$B" -m "$M" -ngl 99 -ncmoe 0 -lm none -fa 1 -b 2048 -ub 2048 -p 0 -n 32 -d 0,8192 -r 3 -o jsonl > "$OUT/bench-d0-d8192.jsonl" 2>/dev/null; say "bench exit $?"
say done
