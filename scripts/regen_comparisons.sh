#!/usr/bin/env bash
# Regenerate every committed comparison of data/llamacpp after a change of the model or of the
# shipped profile (data/llamacpp/README.md: "regenerated whenever the model changes"): the
# folders' compare_*.{csv,md,png}, their same-lease refits (h200-llamacpp-*.toml), both prefetch A/Bs,
# pooled/ and h200x2-predicted/. CPU only, about 10 minutes on 2 cores. Run from the repository
# root with the environment of the README active, after the shipped profile is refit (the
# fit_command of scenarios/hardware/h200-llamacpp.toml): bash scripts/regen_comparisons.sh
# Failures are listed in /tmp/regen.err (the last line says DONE when it finished).
set -uo pipefail
: > /tmp/regen.err
L=data/llamacpp
cmpf() { # dir stem [extra args...]
  local d=$1 s=$2; shift 2
  python -m calibrate.llamacpp.compare "$d" "$@" -q --out "$d/$s.csv" --figure "$d/$s.png" --summary "$d/$s.md" >/dev/null 2>>/tmp/regen.err || echo "FAIL compare $d $s" >> /tmp/regen.err
}
for d in $L/*/; do d=${d%/}; [ -f "$d/compare_llamacpp.csv" ] && cmpf "$d" compare_llamacpp; done
cmpf $L/h200-20261201 compare_untuned --hardware scenarios/hardware/h200.toml
python -m calibrate.llamacpp.fit --run $L/h100-20261206-tg11 --untimed --params cpu_split_us,cpu_rate_scale --out $L/h100-20261206-tg11/h200-llamacpp-tg11.toml >/dev/null 2>>/tmp/regen.err
python -m calibrate.llamacpp.fit --run $L/h100-20261206-tg11 --untimed --max-steal 0.1 --params cpu_split_us,cpu_rate_scale --out $L/h100-20261206-tg11/h200-llamacpp-tg11-steal.toml >/dev/null 2>>/tmp/regen.err
python -m calibrate.llamacpp.fit --run $L/h100-20261206-tg9 --params cpu_split_us,cpu_rate_scale --iterations 4 --out $L/h100-20261206-tg9/h200-llamacpp-tg9.toml >/dev/null 2>>/tmp/regen.err
python -m calibrate.llamacpp.fit --run $L/h200-20261203-tg --params split_us,cpu_rate_scale --iterations 4 --out $L/h200-20261203-tg/h200-llamacpp-refit.toml >/dev/null 2>>/tmp/regen.err
python -m calibrate.llamacpp.fit --run $L/h200-20261203-tg4 --cpu-table $L/h200-20261203-tg4/kernels-cpu.csv --params cpu_split_us,cpu_rate_scale --iterations 4 --out $L/h200-20261203-tg4/h200-llamacpp-tg4.toml >/dev/null 2>>/tmp/regen.err
python -m calibrate.llamacpp.fit --run $L/h200-20261206-tg11 --untimed --max-steal 0.1 --params cpu_split_us,cpu_rate_scale --out $L/h200-20261206-tg11/h200-llamacpp-tg11.toml >/dev/null 2>>/tmp/regen.err
cmpf $L/h100-20261206-tg11 compare_tg11 --hardware $L/h100-20261206-tg11/h200-llamacpp-tg11.toml
cmpf $L/h100-20261206-tg11 compare_tg11_steal --hardware $L/h100-20261206-tg11/h200-llamacpp-tg11-steal.toml --max-steal 0.1
cmpf $L/h100-20261206-tg9 compare_tg9 --hardware $L/h100-20261206-tg9/h200-llamacpp-tg9.toml
cmpf $L/h200-20261203-tg compare_refit --hardware $L/h200-20261203-tg/h200-llamacpp-refit.toml
cmpf $L/h200-20261203-tg4 compare_tg4 --hardware $L/h200-20261203-tg4/h200-llamacpp-tg4.toml
cmpf $L/h200-20261206-tg11 compare_tg11 --hardware $L/h200-20261206-tg11/h200-llamacpp-tg11.toml --max-steal 0.1
for d in h200-20261202-prefetch h200-20261202-prefetch2; do
  python -m calibrate.llamacpp.ab $L/$d --out $L/$d/ab.csv --figure $L/$d/ab.png --summary $L/$d/ab.md >/dev/null 2>>/tmp/regen.err || echo "FAIL ab $d" >> /tmp/regen.err
done
python -m calibrate.llamacpp.pool $L/h200-20261201 $L/h200-20261201-repeat $L/h200-20261202-decode $L/h200-20261203-tg $L/h200-20261203-tg4 \
  $L/h200-20261203-tg5a $L/h200-20261203-tg5b $L/h200-20261204-dense \
  --out $L/pooled/pool.csv --summary $L/pooled/pool.md --figure $L/pooled/pool.png >/dev/null 2>>/tmp/regen.err || echo "FAIL pool" >> /tmp/regen.err
python -m calibrate.llamacpp.predict calibrate/llamacpp/grids/h200x2.toml --scenario scenarios/h200x2-qwen3-30b-a3b.toml --out $L/h200x2-predicted >/dev/null 2>>/tmp/regen.err || echo "FAIL predict" >> /tmp/regen.err
echo DONE >> /tmp/regen.err
