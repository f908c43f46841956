#!/usr/bin/env bash
# Diagnostic lease (docs/llamacpp.md, "Ubatch 2–8"): build llama-bench, write the Qwen3-30B-A3B GGUF in
# parallel, then ncu kernel times of fully resident prompts of 16 tokens at ubatch 1, 2, 4, 8 and 16
# (-fa 1, CUDA graphs off so ncu sees every kernel): how ggml-cuda's matvec kernel (MMVQ, with the
# router ids for MUL_MAT_ID) costs at 2-8 tokens against 1, and llama-bench's own t/s of the same
# prompts with CUDA graphs on. Writes under $OUT.
#   bash scripts/h200_ub4_ncu.sh      (carry .llamacpp and .whl)
set -uo pipefail
: "${OUT:?OUT is not set (the device tool sets it)}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
W=/root/ub4; mkdir -p "$W" "$OUT/logs"
T0=$(date +%s); say() { echo "$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/progress.log"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -m calibrate.llamacpp.gguf_writer --model scenarios/models/qwen3-30b-a3b.toml --out "$W/qwen3.gguf" --seed 0 > "$OUT/logs/gguf.log" 2>&1 & P1=$!
python3 -m calibrate.llamacpp build --src .llamacpp/llama.cpp-src.tgz --work "$W/b" --targets llama-bench > "$OUT/logs/build.log" 2>&1
say "build exit $?"
B=$(find "$W/b" -name llama-bench -type f | head -1)
wait $P1; say "gguf exit $?"
M=$W/qwen3.gguf
NCU="ncu --csv --page raw --metrics gpu__time_duration.sum --cache-control none --clock-control none --launch-count 40000"
for ub in 1 2 4 8 16; do
  GGML_CUDA_DISABLE_GRAPHS=1 timeout 120 $NCU --log-file "$W/ncu-ub$ub.csv" "$B" -m "$M" -ngl 99 -ncmoe 0 -lm none -fa 1 -b 2048 -ub $ub -p 16 -n 0 -r 1 --no-warmup -o jsonl > "$OUT/ncu-ub$ub.jsonl" 2>"$W/ncu-ub$ub.err"; say "ncu ub$ub exit $?"
  gzip -c "$W/ncu-ub$ub.csv" > "$OUT/ncu-qwen3-pp16-ub$ub.csv.gz"
done
timeout 120 "$B" -m "$M" -ngl 99 -ncmoe 0 -lm none -fa 1 -b 2048 -ub 1,2,4,8,16 -p 256 -n 0 -r 3 -o jsonl > "$OUT/bench-pp256.jsonl" 2>/dev/null; say "bench exit $?"
say done
