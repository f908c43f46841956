#!/usr/bin/env bash
# Diagnostic lease (docs/llamacpp.md, "What drives the misses": gpt-oss): build llama-bench,
# write the gpt-oss-20b and Qwen3-30B-A3B GGUFs in parallel, then ncu kernel times (clocks and
# caches not controlled) of fully resident prefill pp2048 at ubatch 2048 on both models (Qwen3:
# the control the profile fits) and of gpt-oss decode at depth 0 and 8192 (CUDA graphs off so
# ncu sees every kernel), and the same rows without ncu (llama-bench -r 3). Writes under $OUT.
#   bash scripts/h200_gptoss_ncu.sh      (carry .llamacpp and .whl)
set -uo pipefail
: "${OUT:?OUT is not set (the device tool sets it)}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
W=/root/gptoss; mkdir -p "$W" "$OUT/logs"
T0=$(date +%s); say() { echo "$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/progress.log"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -m calibrate.llamacpp.gguf_writer --model scenarios/models/gpt-oss-20b.toml --out "$W/gptoss.gguf" --seed 0 > "$OUT/logs/gguf-gptoss.log" 2>&1 & P1=$!
python3 -m calibrate.llamacpp.gguf_writer --model scenarios/models/qwen3-30b-a3b.toml --out "$W/qwen3.gguf" --seed 0 > "$OUT/logs/gguf-qwen3.log" 2>&1 & P2=$!
python3 -m calibrate.llamacpp build --src .llamacpp/llama.cpp-src.tgz --work "$W/b" --targets llama-bench > "$OUT/logs/build.log" 2>&1
say "build exit $?"
B=$(find "$W/b" -name llama-bench -type f | head -1)
wait $P1; say "gguf gpt-oss exit $?"
NCU="ncu --csv --page raw --metrics gpu__time_duration.sum --cache-control none --clock-control none"
G=$W/gptoss.gguf
timeout 90 $NCU --launch-count 3000 --log-file "$W/ncu-gptoss-pp2048.csv" "$B" -m "$G" -ngl 99 -lm none -fa 1 -b 2048 -ub 2048 -p 2048 -n 0 -r 1 --no-warmup -o jsonl > "$OUT/ncu-gptoss-pp2048.jsonl" 2>"$W/e1"; say "ncu gpt-oss pp2048 exit $?"
gzip -c "$W/ncu-gptoss-pp2048.csv" > "$OUT/ncu-gptoss-pp2048-ub2048.csv.gz"
timeout 60 "$B" -m "$G" -ngl 99 -lm none -fa 1 -b 2048 -ub 2048 -p 2048 -n 32 -d 0,8192 -r 3 -o jsonl > "$OUT/bench-gptoss.jsonl" 2>/dev/null; say "bench gpt-oss exit $?"
for d in 0 8192; do
  GGML_CUDA_DISABLE_GRAPHS=1 timeout 100 $NCU --launch-count 9000 --log-file "$W/ncu-tg-d$d.csv" "$B" -m "$G" -ngl 99 -lm none -fa 1 -b 2048 -ub 2048 -p 0 -n 4 -d $d -r 1 --no-warmup -o jsonl > "$OUT/ncu-gptoss-tg-d$d.jsonl" 2>"$W/e2"; say "ncu gpt-oss tg d$d exit $?"
  gzip -c "$W/ncu-tg-d$d.csv" > "$OUT/ncu-gptoss-tg-d$d.csv.gz"
done
wait $P2; say "gguf qwen3 exit $?"
Q=$W/qwen3.gguf
timeout 90 $NCU --launch-count 3000 --log-file "$W/ncu-qwen3-pp2048.csv" "$B" -m "$Q" -ngl 99 -lm none -fa 1 -b 2048 -ub 2048 -p 2048 -n 0 -r 1 --no-warmup -o jsonl > "$OUT/ncu-qwen3-pp2048.jsonl" 2>"$W/e3"; say "ncu qwen3 pp2048 exit $?"
gzip -c "$W/ncu-qwen3-pp2048.csv" > "$OUT/ncu-qwen3-pp2048-ub2048.csv.gz"
timeout 40 "$B" -m "$Q" -ngl 99 -lm none -fa 1 -b 2048 -ub 2048 -p 2048 -n 0 -r 3 -o jsonl > "$OUT/bench-qwen3.jsonl" 2>/dev/null; say "bench qwen3 exit $?"
cp "$W/b"/*/build.json "$OUT/" 2>/dev/null; say done
