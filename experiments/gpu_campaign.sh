#!/usr/bin/env bash
# One prepared GPU sitting for the paper's Table 1 (experiments/paper_table1.py) and the
# throughput of vectorised runs, in the order GPU time should go to them:
#   1. Table 1's headline row: CapsNet, 3 routing iterations, reconstruction, 3 seeds, the
#      paper's 50 epochs, as one vectorised program;
#   2. train images/s of N = 1, 2, 4, 8 runs in one program (paper CapsNet, Efficient-CapsNet);
#   3. the next Table 1 rows while time is left (each stage stops by SIGTERM at its limit,
#      which saves its runs: rerun to continue).
# ROWS and THROUGHPUT choose what a later sitting spends its time on: ROWS is the list of
# `--index` groups in order, each one program (default "0,1,2 3,4,5"; the first gets all but
# 200 s, the others what is left), THROUGHPUT=0 skips the throughput stages. The sitting that
# measured the baseline CNN and the last CapsNet row ran
#   ROWS="12 9,10,11 13 14" THROUGHPUT=0 experiments/gpu_campaign.sh /path/to/mnist OUT 540
# (the baseline's seeds one at a time: its step is compute-bound, so one program of three
# would take three runs' time and finish none of them if cut off).
# Then results.md of what finished, and one tarball of the sweep without its checkpoints.
#
#   experiments/gpu_campaign.sh /path/to/mnist OUT_DIR [SECONDS]
#
# EXPERIMENT (default experiments/paper_table1.py; PATH[:variant]) runs another experiment's
# points the same way (experiments/gpu_official.sh does).
# SECONDS (default 560) is the whole sitting's budget. EXTRA (sweep flags) and BENCH_EXTRA
# (benchmark flags) shrink it for a dry run on a CPU, e.g.
#   EXTRA="--config.train.num_steps=2 --config.train.batch_size=8" BENCH_EXTRA=... \
#     experiments/gpu_campaign.sh /path/to/mnist /tmp/out 300
# Evaluations every 10 epochs, 10 steps per dispatch and a log every half epoch do not change
# what is computed (a dispatch of n steps equals n single steps).
set -uo pipefail
data=$1
out=$2
budget=${3:-560}
work=${WORK:-/tmp/capsjax_campaign}
mkdir -p "$out" "$work"
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$work/xla_cache}
export PYTHONUNBUFFERED=1
python=${PYTHON:-python}
experiment=${EXPERIMENT:-experiments/paper_table1.py}
name=$(basename "${experiment%%:*}" .py)${experiment#"${experiment%%:*}"}
name=${name//:/_}
sweep=("$python" -m capsjax.sweep "$experiment" --workdir="$work/$name"
       --config.data.source=idx --config.data.dir="$data"
       --config.train.eval_every_steps=4680 --config.train.checkpoint_every_steps=100000
       --config.train.steps_per_dispatch=10 --config.train.log_every_steps=230 ${EXTRA:-})

stage() {  # stage NAME SECONDS COMMAND...: runs COMMAND for at most SECONDS, output to OUT.
  local name=$1 limit=$2
  shift 2
  if ((limit < 20)); then
    echo "== $name: skipped, $(left) s left"
    return
  fi
  echo "== $name: limit ${limit} s ($(left) s left)"
  local t0=$(date +%s)
  timeout -s TERM -k 60 "$limit" "$@" >"$out/$name.log" 2>&1
  echo "== $name: exit $? after $(($(date +%s) - t0)) s"
  grep -E "^(Done|Vectorised|  program|\|)" "$out/$name.log" | cut -c1-400
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
rows=(${ROWS:-0,1,2 3,4,5})
reserve=$([[ ${THROUGHPUT:-1} != 0 ]] && echo 200 || echo 25)
stage "${name}_${rows[0]//,/_}" $(($(left) - reserve)) "${sweep[@]}" --vectorize --index="${rows[0]}"
if [[ ${THROUGHPUT:-1} != 0 ]]; then
  stage throughput_capsnet 90 "$python" -m capsjax.benchmark --config=configs/mnist.py \
    --runs=1,2,4,8 --seconds=2 ${BENCH_EXTRA:-}
  stage throughput_efficient 80 "$python" -m capsjax.benchmark \
    --config=configs/efficient_capsnet.py --runs=1,2,4,8 --seconds=2 ${BENCH_EXTRA:-}
fi
for row in "${rows[@]:1}"; do
  stage "${name}_${row//,/_}" $(($(left) - 25)) "${sweep[@]}" --vectorize --index="$row"
done
"${sweep[@]}" --collect >"$out/collect.log" 2>&1
cp "$work/$name/results.md" "$out/" 2>/dev/null && cat "$out/results.md"
tar czf "$out/$name.tgz" --exclude=checkpoints --exclude=tensorboard --exclude=xla_cache \
  -C "$work" "$name"
echo "== done in $(($(date +%s) - start)) s"
