#!/usr/bin/env bash
# One prepared GPU sitting for the speed issue ("Accelerator speed ..."): whether the routers'
# written-out backward passes (routing.gradient=analytic: EM's, the CPU's default, and dynamic
# routing's, nowhere the default yet) are faster on the GPU than autodiff of the reference (the
# GPU's default until this says otherwise), then the roofline and per-layer profile of the
# paper CapsNet and of EM. Each benchmark prints its
# JSON line last; this script keeps those lines in OUT/speed.jsonl.
#
#   experiments/gpu_speed.sh OUT_DIR [SECONDS_PER_RATE]
#
# About 7 minutes on an H100 with SECONDS_PER_RATE=3 (compilation included). On a CPU, as a
# dry run: BATCHES=4 PROFILE_BATCH=4 experiments/gpu_speed.sh /tmp/out 1
set -uo pipefail
out=$1
seconds=${2:-3}
python=${PYTHON:-python}
mkdir -p "$out"
bench() {  # bench NAME ARGS...: one benchmark, its log in OUT/NAME.log, its JSON line kept.
  local name=$1
  shift
  timeout -k 30 240 "$python" -m capsjax.benchmark --seconds="$seconds" "$@" \
    >"$out/$name.log" 2>&1
  echo "== $name: exit $?"
  tail -n 1 "$out/$name.log" | grep '^{' | sed "s/^{/{\"name\": \"$name\", /" \
    | tee -a "$out/speed.jsonl" | cut -c1-300
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
for batch in ${BATCHES:-128 16}; do
  for gradient in autodiff analytic; do
    bench "em_b${batch}_${gradient}" --config=configs/em_mnist.py \
      --config.train.batch_size="$batch" --config.model.routing.gradient="$gradient"
    bench "capsnet_b${batch}_${gradient}" --config=configs/mnist.py \
      --config.train.batch_size="$batch" --config.model.routing.gradient="$gradient"
  done
done
profile_batch=${PROFILE_BATCH:-128}
bench "capsnet_b${profile_batch}_profile" --config=configs/mnist.py \
  --config.train.batch_size="$profile_batch" --profile
bench "em_b${profile_batch}_profile" --config=configs/em_mnist.py \
  --config.train.batch_size="$profile_batch" --profile
