#!/usr/bin/env bash
# Diagnostic lease (docs/llamacpp.md, "What drives the misses"): build llama-bench, write the
# Gemma-3-27B and gpt-oss-20b GGUFs in parallel, then record which backend ggml's scheduler
# gives each node of a Gemma -ngl 31 prefill graph (GGML_SCHED_DEBUG=2) and ncu kernel times of
# that graph, of gpt-oss pp2048 at -ub 2048 and of Gemma fully resident. Writes under $OUT.
#   bash scripts/h200_diag.sh      (carry .llamacpp and .whl)
set -uo pipefail
: "${OUT:?OUT is not set (the device tool sets it)}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
W=/root/diag; mkdir -p "$W" "$OUT/logs"
T0=$(date +%s); say() { echo "$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/progress.log"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -m calibrate.llamacpp.gguf_writer --model scenarios/models/gemma3-27b.toml --out "$W/gemma3-27b.gguf" --seed 0 > "$OUT/logs/gguf-gemma.log" 2>&1 & P1=$!
python3 -m calibrate.llamacpp.gguf_writer --model scenarios/models/gpt-oss-20b.toml --out "$W/gpt-oss-20b.gguf" --seed 0 > "$OUT/logs/gguf-gptoss.log" 2>&1 & P2=$!
python3 -m calibrate.llamacpp build --src .llamacpp/llama.cpp-src.tgz --work "$W/b" --targets llama-bench > "$OUT/logs/build.log" 2>&1
say "build exit $?"
B=$(find "$W/b" -name llama-bench -type f | head -1)
wait $P1; say "gguf gemma exit $?"; wait $P2; say "gguf gpt-oss exit $?"
G=$W/gemma3-27b.gguf; O=$W/gpt-oss-20b.gguf
NCU="ncu --csv --page raw --metrics gpu__time_duration.sum --cache-control none --clock-control none --launch-count 6000"
GGML_SCHED_DEBUG=2 timeout 60 "$B" -v -m "$G" -ngl 31 -lm none -fa 1 -b 512 -ub 512 -p 512 -n 0 -r 1 --no-warmup -o jsonl \
  > "$OUT/gemma-ngl31-sched.jsonl" 2> "$W/sched.err"; say "sched exit $?"; gzip -c "$W/sched.err" > "$OUT/gemma-ngl31-sched.err.gz"
GGML_CUDA_DISABLE_GRAPHS=1 timeout 80 $NCU --log-file "$W/ncu-gemma-ngl31.csv" "$B" -m "$G" -ngl 31 -lm none -fa 1 -b 512 -ub 512 -p 512 -n 0 -r 1 --no-warmup -o jsonl > "$OUT/ncu-gemma-ngl31.jsonl" 2>/dev/null; say "ncu gemma ngl31 exit $?"
GGML_CUDA_DISABLE_GRAPHS=1 timeout 80 $NCU --log-file "$W/ncu-gptoss-pp2048.csv" "$B" -m "$O" -ngl 99 -lm none -fa 1 -b 2048 -ub 2048 -p 2048 -n 0 -r 1 --no-warmup -o jsonl > "$OUT/ncu-gptoss-pp2048.jsonl" 2>/dev/null; say "ncu gpt-oss exit $?"
GGML_CUDA_DISABLE_GRAPHS=1 timeout 80 $NCU --log-file "$W/ncu-gemma-pp512.csv" "$B" -m "$G" -ngl 99 -lm none -fa 1 -b 512 -ub 512 -p 512 -n 0 -r 1 --no-warmup -o jsonl > "$OUT/ncu-gemma-pp512.jsonl" 2>/dev/null; say "ncu gemma resident exit $?"
for f in "$W"/ncu-*.csv; do gzip -c "$f" > "$OUT/$(basename "$f").gz"; done
say done
