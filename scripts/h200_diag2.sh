#!/usr/bin/env bash
# Diagnostic lease, two questions in one build (docs/llamacpp.md, "Ubatch 2–8" and "gpt-oss decode at
# depth"):
#  1. ubatch 2-8: ncu kernel times of Qwen3-30B-A3B fully resident prompts of 8 tokens at ubatch 1,
#     2, 4 and 8 in one model load (-fa 1, CUDA graphs off so ncu sees every kernel: ggml-cuda's
#     matvec kernel with the router ids at 2-8 tokens against 1) and llama-bench's own pp256 at
#     ubatch 1-16;
#  2. gpt-oss-20b resident decode at depth: tg128 at depth 0 and 8192, -r 5, in the ground truth's
#     invocation (-p 512 -n 128, whose tg128 @ d8192 restores the depth state the pp512 test saved)
#     and in the decode leases' (-p 0 -n 128), alternated, plain and with the phase-time patch.
# Runs in the background (setsid) so that two device calls can hold it:
#   bash scripts/h200_diag2.sh start [WAIT_S]  # build, GGUFs, measurements; waits up to WAIT_S (540) s, packs $OUT/diag2-a.tgz
#   bash scripts/h200_diag2.sh collect  # waits for the rest, packs $OUT/diag2.tgz
#   DIAG2_PARTS=gptoss bash scripts/h200_diag2.sh start 420  # question 2 alone (a short lease: no Qwen3 GGUF)
#  3. (part "restore", 2026-12-07) why the ground truth's form decodes gpt-oss slower at depth 8192:
#     the two forms with CUDA graphs off (GGML_CUDA_DISABLE_GRAPHS=1), a third form whose depth
#     state is saved by a context of the tg test's own size (-p 1 -n 128: pp1 @ d8192 holds 8193
#     tokens, 8448 cells, as tg128 @ d8192's 8320), and ncu kernel times of a tg16 @ d8192 in the
#     gt and tg forms (CUDA graphs on: ncu times each graph node).
#  4. (part "ubheld", 2026-12-07) the small-batch kernel prices (calibrate.llamacpp.smallbatch,
#     measured on Qwen3) on the two other architectures: gpt-oss-20b and Gemma-3-27B fully resident,
#     pp256 at ubatch 1, 2, 4, 8, 16 (-r 3), and ncu of gpt-oss pp8 at ubatch 1, 2, 4, 8.
#  5. (part "gemmancu", 2026-12-07) Gemma-3-27B under ncu as Qwen3 (pp8 at ubatch 1, 2, 4, 8, CUDA
#     graphs off) beside its pp256 at ubatch 1-16: the small-batch kernel numbers on a dense model.
#  6. (part "pform", 2026-12-07) which part of the invocation's history slows gpt-oss's restored decode
#     at depth 8192: tg128 @ d8192 after a pp test at the same depth of -p 1, 64, 256 (its context
#     has the tg test's 8448 cells), 512, 768, 2048, 4096 (more cells), the -p 0 form, alternated,
#     with nvidia-smi's clocks, power and temperature every 0.2 s beside; then ncu of the
#     FlashAttention kernels alone (the other kernels run unprofiled) of a tg16 @ d8192 in the
#     -p 512 and -p 1 forms.
#  7. (part "pform2", 2026-12-07) the same question on the two other architectures: Qwen3-30B-A3B (no
#     sliding window) and Gemma-3-27B (sliding window 1024 on 5 of 6 layers) fully resident, tg at
#     depth 0 and 8192 in the -p 512, -p 1 and -p 0 forms, alternated, twice.
#  8. (part "pform3", 2026-12-07) gpt-oss's -p 512 and -p 1 forms with ggml-cuda's programmatic
#     dependent launch off (GGML_CUDA_PDL=0) and with its op fusion off (GGML_CUDA_DISABLE_FUSION=1).
#  9. (part "depth32k", 2026-12-07) decode at depths 0-32768 (tg64 at -d 0,8192,16384,24576,32768,
#     -p 0) of Qwen3-30B-A3B and gpt-oss-20b fully resident: the shape of the depth cost past 16k.
# DIAG2_PARTS: a comma list of gptoss, restore, qwen3, ubheld, gemmancu, pform, pform2, pform3, depth32k (default gptoss,qwen3; "all" is the same);
#   DIAG2_PARTS=restore,qwen3 bash scripts/h200_diag2.sh start 540, then collect.
# Carry .llamacpp and .whl.
set -uo pipefail
: "${OUT:?OUT is not set (the device tool sets it)}"
mode=${1:-start}
W=/root/diag2
pack() {  # $1: archive name
  tar czf "$OUT/$1" -C "$W" out 2>/dev/null; ls -la "$OUT"; tail -30 "$W/out/progress.log"
}
wait_done() {  # $1: seconds
  local t=0
  while [ ! -e "$W/done" ] && [ "$t" -lt "$1" ]; do sleep 5; t=$((t + 5)); done
}
if [ "$mode" = collect ]; then
  [ -d "$W" ] || { echo "no diag2 run on this machine (it was given back?)"; exit 2; }
  wait_done 560; pack diag2.tgz; exit 0
fi
if [ "$mode" = start ]; then
  mkdir -p "$W/out/logs"
  DIAG2_PARTS=${DIAG2_PARTS:-all} setsid bash "$0" run > "$W/out/logs/script.log" 2>&1 < /dev/null &
  wait_done "${2:-540}"; pack diag2-a.tgz; exit 0
fi
# mode run: the measurements
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
O=$W/out
T0=$(date +%s); say() { echo "$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*" | tee -a "$O/progress.log"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -2;
  lscpu | grep -E "Model name|^CPU\(s\)"; git rev-parse HEAD 2>/dev/null; date -u +%FT%TZ; } > "$O/meta.txt" 2>&1
PARTS=,${DIAG2_PARTS:-gptoss,qwen3},; [ "$PARTS" = ,all, ] && PARTS=,gptoss,qwen3,
part() { case $PARTS in *,$1,*) return 0 ;; esac; return 1; }
P1=
P3=
{ part ubheld || part gemmancu || part pform2; } && { python3 -m calibrate.llamacpp.gguf_writer --model scenarios/models/gemma3-27b.toml --out "$W/gemma.gguf" --seed 0 > "$O/logs/gguf-gemma.log" 2>&1 & P3=$!; }
{ part qwen3 || part pform2 || part depth32k; } && { python3 -m calibrate.llamacpp.gguf_writer --model scenarios/models/qwen3-30b-a3b.toml --out "$W/qwen3.gguf" --seed 0 > "$O/logs/gguf-qwen3.log" 2>&1 & P1=$!; }
python3 -m calibrate.llamacpp.gguf_writer --model scenarios/models/gpt-oss-20b.toml --out "$W/gptoss.gguf" --seed 0 > "$O/logs/gguf-gptoss.log" 2>&1 & P2=$!
python3 -m calibrate.llamacpp build --src .llamacpp/llama.cpp-src.tgz --work "$W/b" --targets llama-bench > "$O/logs/build.log" 2>&1
say "build exit $?"
cp "$W"/b/*/build.json "$O/" 2>/dev/null
B=$(find "$W/b" -name llama-bench -type f | head -1)
NCU="ncu --csv --page raw --metrics gpu__time_duration.sum --cache-control none --clock-control none"
wait $P2; say "gguf gpt-oss exit $?"
G=$W/gptoss.gguf
# 2. gpt-oss decode at depth in the two invocation forms the committed leases used, alternated on
# one machine: "gt" as the ground truth ran it (-p 512 -n 128: the pp512 @ d8192 test fills the
# depth and saves its state, and tg128 @ d8192, next, restores that state in every repetition) and
# "tg" as the decode leases ran it (-p 0: tg128 @ d8192 fills the depth in its repetition 0);
# plain twice each (gt, tg, gt, tg), then each with the phase timing alone
GT="-p 512 -n 128"; TG="-p 0 -n 128"
GA="-ngl 99 -ncmoe 0 -lm none -fa on -b 2048 -ub 512"
if part gptoss; then
  for f in gt1 tg1 gt2 tg2; do
    case $f in gt*) A=$GT ;; *) A=$TG ;; esac
    timeout 100 "$B" -m "$G" -ngl 99 -ncmoe 0 -lm none -fa on -b 2048 -ub 512 $A -d 0,8192 -r 5 -o jsonl > "$O/bench-gptoss-$f.jsonl" 2>/dev/null; say "bench gpt-oss $f exit $?"
  done
  for f in gt tg; do
    case $f in gt) A=$GT ;; *) A=$TG ;; esac
    PREFETCH_SIM_PHASE_TIME=1 timeout 100 "$B" -m "$G" -ngl 99 -ncmoe 0 -lm none -fa on -b 2048 -ub 512 $A -d 0,8192 -r 5 -o jsonl > "$O/phase-gptoss-$f.jsonl" 2> "$O/logs/phase-gptoss-$f.log"; say "phase gpt-oss $f exit $?"
  done
fi
# 3. restore: the two forms with CUDA graphs off; the -p 1 form (its depth state saved by a context of
# 8448 cells, the tg test's size); plain gt and tg again beside them (drift); ncu of a tg16 @ d8192
# in the gt and tg forms, every kernel of the run (the tg16 graphs' are the log's last rows)
if part restore; then
  P1F="-p 1 -n 128"
  for f in gt1 tg1 gtng tgng p1 gt2 tg2 p1b; do
    case $f in gt*) A=$GT ;; tg*) A=$TG ;; p1*) A=$P1F ;; esac
    case $f in *ng) E=GGML_CUDA_DISABLE_GRAPHS=1 ;; *) E= ;; esac
    env $E timeout 120 "$B" -m "$G" $GA $A -d 0,8192 -r 5 -o jsonl > "$O/restore-gptoss-$f.jsonl" 2>/dev/null; say "restore gpt-oss $f exit $?"
  done
  for f in gt tg; do
    case $f in gt) A="-p 512 -n 16" ;; *) A="-p 0 -n 16" ;; esac
    timeout 150 $NCU --log-file "$W/ncu-restore-$f.csv" "$B" -m "$G" $GA $A -d 8192 -r 1 --no-warmup -o jsonl > "$O/ncu-restore-$f.jsonl" 2>"$O/logs/ncu-restore-$f.err"; say "ncu restore $f exit $?"
    gzip -c "$W/ncu-restore-$f.csv" > "$O/ncu-restore-gptoss-$f.csv.gz"
  done
fi
# 6. pform: the restored decode at depth after pp tests of several sizes (docs/llamacpp.md, "Decode
# at depth after a restored state"); clocks beside
if part pform; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -lms 200 > "$O/pform-clocks.csv" 2>&1 & SMI=$!
  for f in p512a p1a p256a p2048a p64a p0a p768a p4096a p512b p256b p1b p0b p512c p256c; do
    case $f in p0*) A="-p 0 -n 128" ;; *) n=${f#p}; A="-p ${n%?} -n 128" ;; esac
    say "pform $f start ($A)"
    timeout 120 "$B" -m "$G" $GA $A -d 0,8192 -r 5 -o jsonl > "$O/pform-gptoss-$f.jsonl" 2>/dev/null; say "pform $f exit $?"
  done
  kill $SMI 2>/dev/null
  for f in p512 p1; do
    A="-p ${f#p} -n 16"
    timeout 200 $NCU --kernel-name regex:flash_attn --log-file "$W/ncu-pform-$f.csv" "$B" -m "$G" $GA $A -d 8192 -r 1 --no-warmup -o jsonl > "$O/ncu-pform-$f.jsonl" 2>"$O/logs/ncu-pform-$f.err"; say "ncu pform $f exit $?"
    gzip -c "$W/ncu-pform-$f.csv" > "$O/ncu-pform-gptoss-$f.csv.gz"
  done
fi
# 9. depth32k: decode at depths to 32768 on Qwen3 and gpt-oss
if part depth32k; then
  timeout 150 "$B" -m "$G" $GA -p 0 -n 64 -d 0,8192,16384,24576,32768 -r 3 -o jsonl > "$O/depth32k-gptoss.jsonl" 2>/dev/null; say "depth32k gpt-oss exit $?"
  wait $P1; say "gguf qwen3 exit $?"
  timeout 200 "$B" -m "$W/qwen3.gguf" $GA -p 0 -n 64 -d 0,8192,16384,24576,32768 -r 3 -o jsonl > "$O/depth32k-qwen3.jsonl" 2>/dev/null; say "depth32k qwen3 exit $?"
  P1=
fi
# 8. pform3: gpt-oss's two forms with PDL off and with fusion off
if part pform3; then
  for f in p512 p1 p512pdl0 p1pdl0 p512nofuse p1nofuse p512b p1b p512pdl0b p1pdl0b p512nofuseb p1nofuseb; do
    case $f in p512*) A="-p 512 -n 128" ;; *) A="-p 1 -n 128" ;; esac
    case $f in *pdl0*) E=GGML_CUDA_PDL=0 ;; *nofuse*) E=GGML_CUDA_DISABLE_FUSION=1 ;; *) E= ;; esac
    env $E timeout 120 "$B" -m "$G" $GA $A -d 0,8192 -r 5 -o jsonl > "$O/pform3-gptoss-$f.jsonl" 2>/dev/null; say "pform3 $f ($E) exit $?"
  done
fi
# 7. pform2: the invocation forms on Qwen3 (no sliding window) and Gemma (sliding window)
if part pform2; then
  wait $P1; say "gguf qwen3 exit $?"
  wait $P3; say "gguf gemma exit $?"
  for f in p512a p1a p0a p512b p1b p0b; do
    n=${f#p}; n=${n%?}
    timeout 150 "$B" -m "$W/qwen3.gguf" $GA -p $n -n 128 -d 0,8192 -r 5 -o jsonl > "$O/pform2-qwen3-$f.jsonl" 2>/dev/null; say "pform2 qwen3 $f exit $?"
    timeout 200 "$B" -m "$W/gemma.gguf" -ngl 99 -lm none -fa on -b 2048 -ub 512 -p $n -n 64 -d 0,8192 -r 5 -o jsonl > "$O/pform2-gemma-$f.jsonl" 2>/dev/null; say "pform2 gemma $f exit $?"
  done
  P1=
fi
# 4. ubheld: prompts at ubatch 1-16 on gpt-oss and Gemma (held out from the small-batch numbers)
if part ubheld; then
  timeout 120 "$B" -m "$G" -ngl 99 -ncmoe 0 -lm none -fa 1 -b 2048 -ub 1,2,4,8,16 -p 256 -n 0 -r 3 -o jsonl > "$O/bench-gptoss-pp256.jsonl" 2>/dev/null; say "bench gpt-oss pp256 exit $?"
  GGML_CUDA_DISABLE_GRAPHS=1 timeout 150 $NCU --launch-count 40000 --log-file "$W/ncu-gptoss-ub.csv" "$B" -m "$G" -ngl 99 -ncmoe 0 -lm none -fa 1 -b 2048 -ub 1,2,4,8 -p 8 -n 0 -r 1 --no-warmup -o jsonl > "$O/ncu-gptoss-pp8.jsonl" 2>"$O/logs/ncu-gptoss-ub.err"; say "ncu gpt-oss ub exit $?"
  gzip -c "$W/ncu-gptoss-ub.csv" > "$O/ncu-gptoss-pp8-ub1-8.csv.gz"
  wait $P3; say "gguf gemma exit $?"
  timeout 180 "$B" -m "$W/gemma.gguf" -ngl 99 -lm none -fa 1 -b 2048 -ub 1,2,4,8,16 -p 256 -n 0 -r 3 -o jsonl > "$O/bench-gemma-pp256.jsonl" 2>/dev/null; say "bench gemma pp256 exit $?"
fi
# 5. gemmancu: Gemma's kernels at ubatch 1-8, and its pp256 beside them (ncu's overhead per kernel)
if part gemmancu; then
  wait $P3; say "gguf gemma exit $?"
  timeout 180 "$B" -m "$W/gemma.gguf" -ngl 99 -lm none -fa 1 -b 2048 -ub 1,2,4,8,16 -p 256 -n 0 -r 3 -o jsonl > "$O/bench-gemma-pp256.jsonl" 2>/dev/null; say "bench gemma pp256 exit $?"
  GGML_CUDA_DISABLE_GRAPHS=1 timeout 240 $NCU --launch-count 60000 --log-file "$W/ncu-gemma-ub.csv" "$B" -m "$W/gemma.gguf" -ngl 99 -lm none -fa 1 -b 2048 -ub 1,2,4,8 -p 8 -n 0 -r 1 --no-warmup -o jsonl > "$O/ncu-gemma-pp8.jsonl" 2>"$O/logs/ncu-gemma-ub.err"; say "ncu gemma ub exit $?"
  gzip -c "$W/ncu-gemma-ub.csv" > "$O/ncu-gemma-pp8-ub1-8.csv.gz"
fi
if [ -z "$P1" ]; then say done; touch "$W/done"; exit 0; fi
wait $P1; say "gguf qwen3 exit $?"
Q=$W/qwen3.gguf
# 1. ubatch 1-8 on Qwen3, one model load: llama-bench runs -ub 1, 2, 4, 8 in turn (8, 4, 2 and 1 graphs)
GGML_CUDA_DISABLE_GRAPHS=1 timeout 200 $NCU --launch-count 40000 --log-file "$W/ncu-ub.csv" "$B" -m "$Q" -ngl 99 -ncmoe 0 -lm none -fa 1 -b 2048 -ub 1,2,4,8 -p 8 -n 0 -r 1 --no-warmup -o jsonl > "$O/ncu-qwen3-pp8.jsonl" 2>"$O/logs/ncu-ub.err"; say "ncu ub exit $?"
gzip -c "$W/ncu-ub.csv" > "$O/ncu-qwen3-pp8-ub1-8.csv.gz"
timeout 120 "$B" -m "$Q" -ngl 99 -ncmoe 0 -lm none -fa 1 -b 2048 -ub 1,2,4,8,16 -p 256 -n 0 -r 3 -o jsonl > "$O/bench-qwen3-pp256.jsonl" 2>/dev/null; say "bench qwen3 pp256 exit $?"
say done
touch "$W/done"
