#!/usr/bin/env bash
# One prepared GPU sitting for the speed issue, in the order GPU time should go to it:
#   1. the peer beside capsjax, at batch 128 then 16 (PEER_BATCHES): the paper CapsNet in
#      PyTorch (experiments/torch_capsnet.py; TF32 matmuls, as JAX's default precision on
#      GPUs) with torch.compile in its CUDA-graph mode (reduce-overhead), then capsjax's
#      benchmark of the same network (configs/mnist.py:text) at the same batch, one after the
#      other on one machine (issue 62's "x torch.compile" rows); then torch.compile's default
#      mode at each batch;
#   2. vectorised runs: train images/s of 1, 2, 4 and 8 paper-CapsNet runs in one program,
#      with XLA's convolutions (grouped under vmap) and as im2col matmuls (batched);
#   3. the routers' gradients, batch 128 and 16 (BATCHES): EM's train step, dynamic routing's
#      written-out backward pass against autodiff, the routing alone
#      (experiments/dynamic_gradient.py, which checks both agree first), and EM's routing
#      alone, its loop against the two forms it replaced (experiments/em_loop_forms.py);
#   4. the roofline and per-layer profile of the paper CapsNet and of EM;
#   5. (STAGES=bf16) the paper CapsNet's speed with model.compute_dtype=bfloat16 at batch 128
#      and 16, and, with DATA=/path/to/mnist, the headline row's accuracy in bf16 (3 seeds,
#      50 epochs, experiments/paper_table1.py:bf16, within BF16_SECONDS, default 300).
# Each benchmark prints its JSON line last; this script keeps those lines in OUT/speed.jsonl
# (the peer's carry "framework": "pytorch ...").
#
#   experiments/gpu_speed.sh OUT_DIR [SECONDS_PER_RATE]
#
# STAGES chooses and orders them (default "peer runs gradients profile"). On a CPU, as a dry
# run (the peer needs PyTorch, which capsjax does not install: its lines then say so; with
# PyTorch on PYTHONPATH or as PEER_PYTHON the peer runs on the CPU as well):
#   PEER_BATCHES=4 BATCHES=4 PROFILE_BATCH=4 experiments/gpu_speed.sh /tmp/out 1
set -uo pipefail
out=$1
seconds=${2:-3}
python=${PYTHON:-python}
mkdir -p "$out"
keep() {  # keep NAME: OUT/NAME.log's last line, a report's object or --runs' list of objects,
  # appended to OUT/speed.jsonl with its name ({"name": ..., "runs": [...]} for a list).
  tail -n 1 "$out/$1.log" \
    | sed -n -e "s/^{/{\"name\": \"$1\", /p" -e "s/^\(\[.*\]\)$/{\"name\": \"$1\", \"runs\": \1}/p" \
    | tee -a "$out/speed.jsonl" | cut -c1-300
}
bench() {  # bench NAME ARGS...: one benchmark, its log in OUT/NAME.log, its JSON line kept.
  local name=$1
  shift
  timeout -k 30 240 "$python" -m capsjax.benchmark --seconds="$seconds" "$@" \
    >"$out/$name.log" 2>&1
  echo "== $name: exit $?"
  keep "$name"
}
peer() {  # peer NAME ARGS...: experiments/torch_capsnet.py, its JSON line kept likewise.
  local name=$1
  shift
  timeout -k 30 240 "${PEER_PYTHON:-$python}" experiments/torch_capsnet.py \
    --seconds="$seconds" "$@" >"$out/$name.log" 2>&1
  echo "== $name: exit $?"
  keep "$name"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
git log -1 --format=%h 2>/dev/null
for stage in ${STAGES:-peer runs gradients profile}; do
  case $stage in
    peer)
      # The pairs first (the peer's best mode, CUDA graphs, beside capsjax), so that a sitting
      # cut short still has its ratios; torch.compile's default mode after them.
      for batch in ${PEER_BATCHES:-128 16}; do
        peer "torch_b${batch}_compile_graphs" --batch_size="$batch" --compile \
          --compile_mode=reduce-overhead
        # :text, the network the peer builds (8,215,568 parameters: no class bias, PrimaryCaps
        # unscaled); the default's code settings add 160 parameters and two additions.
        bench "capsnet_b${batch}" --config=configs/mnist.py:text \
          --config.train.batch_size="$batch"
      done
      if [[ ${PEER_DEFAULT:-1} != 0 ]]; then  # PEER_DEFAULT=0: the pairs alone.
        for batch in ${PEER_BATCHES:-128 16}; do
          peer "torch_b${batch}_compile" --batch_size="$batch" --compile
        done
      fi ;;
    runs)
      bench capsnet_runs --config=configs/mnist.py --runs=1,2,4,8 \
        --config.train.batch_size="${RUNS_BATCH:-128}"
      # The runs' convolutions as batched matmuls (im2col) rather than the grouped
      # convolutions that vmap makes of XLA's (issue 62 item 4's candidate).
      bench capsnet_runs_im2col --config=configs/mnist.py --runs=1,2,4,8 \
        --config.train.batch_size="${RUNS_BATCH:-128}" --config.model.conv_impl=im2col ;;
    gradients)
      for batch in ${BATCHES:-128 16}; do
        bench "em_b${batch}" --config=configs/em_mnist.py --config.train.batch_size="$batch"
      done
      # Dynamic routing's written-out backward pass is an experiment, not a setting: its
      # JSON lines (routing alone, both forms) go to the same file.
      timeout -k 30 240 "$python" experiments/dynamic_gradient.py \
        --batches="$(echo ${BATCHES:-128 16} | tr ' ' ,)" >"$out/dynamic_gradient.log" 2>&1
      echo "== dynamic_gradient: exit $?"
      sed -n 's/^{/{"name": "dynamic_gradient", /p' "$out/dynamic_gradient.log" \
        | tee -a "$out/speed.jsonl" | cut -c1-300
      # EM's loop once (issue 78 item 7): the router's loop, differentiated by JAX, against the
      # custom VJP and the child-major reference loop it replaced, ConvCaps1's routing alone.
      timeout -k 30 240 "$python" experiments/em_loop_forms.py \
        --batches="$(echo ${EM_LOOP_BATCHES:-16 4} | tr ' ' ,)" >"$out/em_loop_forms.log" 2>&1
      echo "== em_loop_forms: exit $?"
      sed -n 's/^{/{"name": "em_loop_forms", /p' "$out/em_loop_forms.log" \
        | tee -a "$out/speed.jsonl" | cut -c1-300 ;;
    profile)  # PROFILE_BATCH (or PROFILE_BATCHES) and PROFILE_MODELS choose what is profiled.
      for profile_batch in ${PROFILE_BATCHES:-${PROFILE_BATCH:-128}}; do
        for model in ${PROFILE_MODELS:-capsnet em}; do
          case $model in
            capsnet) config=configs/mnist.py ;;
            capsnet_text) config=configs/mnist.py:text ;;
            em) config=configs/em_mnist.py ;;
            *) echo "unknown PROFILE_MODELS entry '$model' (capsnet, capsnet_text, em)" >&2
               exit 2 ;;
          esac
          bench "${model}_b${profile_batch}_profile" --config="$config" \
            --config.train.batch_size="$profile_batch" --profile
        done
      done ;;
    bf16)
      for batch in ${PEER_BATCHES:-128 16}; do
        bench "capsnet_b${batch}_bf16" --config=configs/mnist.py \
          --config.train.batch_size="$batch" --config.model.compute_dtype=bfloat16
      done
      if [[ -n ${DATA:-} ]]; then  # The headline row's accuracy in bf16, 3 seeds.
        EXPERIMENT=experiments/paper_table1.py:bf16 ROWS="0,1,2" THROUGHPUT=0 \
          PYTHON="$python" "$(dirname "$0")/gpu_campaign.sh" "$DATA" "$out/bf16" \
          "${BF16_SECONDS:-300}"
      fi ;;
    *) echo "unknown stage '$stage': the stages are peer, runs, gradients, profile and bf16" >&2
       exit 2 ;;
  esac
done
