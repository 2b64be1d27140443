#!/usr/bin/env bash
# The next 15-minute sitting on one GPU, prepared (issue 69 item 5). Stages, in this order,
# each stopped at its own limit (a sweep by SIGTERM, which saves its runs: the same command
# on the same machine continues them); what finished is packed after every stage, so a cut
# sitting returns it:
#   a. :float32, the default in full float32 (matmul_precision="float32", as the authors'
#      code ran on 2017's GPUs; every earlier GPU row used TF32), on the code's validation
#      split, 3 seeds as one program (experiments/paper_table1_official.py:float32; beside
#      :validation's :official row, validation 0.49 +- 0.04%, test 0.40 +- 0.03%, TF32);
#   b. :stream, the default with the code's order of examples (each digit's 25 shifts in a
#      row through a shuffle of 5,384), the same split and seeds;
#   c. the per-layer profile of the paper CapsNet's train step (configs/mnist.py:text) at
#      batch 128 and 16: which kernels take its ~2.77 ms (the speed work waits for it);
#   d. capsjax beside the PyTorch peer with torch.compile's CUDA graphs at batch 128 and 16
#      (experiments/torch_capsnet.py; python3 on the device machine holds PyTorch).
# Every run keeps its test and validation predictions (predictions.npz), so later sittings can
# be compared with these digit by digit (python -m capsjax.compare).
#
# What comes back ($OUT: at most 8 files): OUT/summary.md (experiments/sitting_summary.py:
# one table per stage, "not run" or "not finished" where so) and OUT/sitting.tgz (every
# stage's logs, results.md and speed.jsonl, and the sweeps without checkpoints: summaries,
# metrics, predictions).
#
# Before the sitting, here (the device machine reaches nothing; its python3 has JAX, Flax,
# Optax, Orbax and PyTorch, not ml-collections or tensorboardX; /.data/ and /.whl/ are in
# .gitignore):
#   mkdir -p .data/mnist && cp /path/to/mnist/*.gz .data/mnist/
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform any -d .whl ml-collections==1.1.0 tensorboardX==2.6.5
# then one device call of at most 10 minutes for a and b, and one for c and d, each carrying
# [".data", ".whl"]:
#   STAGES="a b" experiments/gpu_sitting.sh .data/mnist $OUT 570     # ~9.5 minutes
#   STAGES="c d" experiments/gpu_sitting.sh .data/mnist $OUT 280     # ~4.5 minutes
# (one machine start each when the second call finds none warm: ~1.5 minutes). A_SECONDS,
# B_SECONDS, C_SECONDS and D_SECONDS cap each stage (default 330, 230, 120, 150).
#
#   experiments/gpu_sitting.sh DATA_DIR OUT_DIR [SECONDS]
#
# TINY=1: the same stages on the smoke model for a few steps, the profile and the pairs at
# batch 4 (a dry run on a CPU; the peer's lines then say PyTorch is missing).
set -uo pipefail
data=$1
out=$2
budget=${3:-570}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
local=${SITTING_DIR:-/tmp/capsjax_sitting}
mkdir -p "$out" "$local"
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
capped() { local cap=$1 rest=$(($(left) - 20)); echo $((cap < rest ? cap : rest)); }
export PYTHONUNBUFFERED=1
export PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
if [[ -d $repo/.whl ]] && ls "$repo"/.whl/*.whl >/dev/null 2>&1; then  # Carried wheels.
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/capsjax_site "$repo"/.whl/*.whl || exit 2
  export PYTHONPATH=/tmp/capsjax_site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}
cd "$repo" || exit 2
"$PYTHON" -c "import capsjax.sweep, ml_collections, tensorboardX" || {
  echo "capsjax does not import here: carry the wheels (see this script's header)" >&2; exit 2; }
tiny=$([[ ${TINY:-0} != 0 ]] && echo "tiny_" || echo "")
small=$([[ ${TINY:-0} != 0 ]] && echo "4" || echo "128 16")

pack() {  # What finished so far: the summary and one tarball, in OUT.
  { echo "commit $(git log -1 --format=%h 2>/dev/null), $(date -u +%FT%TZ)"
    echo "$machine"
    echo
    "$PYTHON" "$here/sitting_summary.py" "$local"; } >"$out/summary.md" 2>&1
  tar czf "$out/sitting.tgz" --exclude=checkpoints --exclude=tensorboard \
    --exclude=xla_cache --exclude=./work -C "$local" . 2>/dev/null
}

machine="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  2>/dev/null); $("$PYTHON" -c "import jax, flax, optax; print('jax', jax.__version__, 'flax',
flax.__version__, 'optax', optax.__version__, jax.devices())" 2>&1 | tail -1)"
echo "$machine"
git log -1 --format="commit %h" 2>/dev/null
for stage in ${STAGES:-a b c d}; do
  case $stage in
    a|b)
      variant=$([[ $stage == a ]] && echo float32 || echo stream)
      cap=$([[ $stage == a ]] && echo "${A_SECONDS:-330}" || echo "${B_SECONDS:-230}")
      limit=$(capped "$cap")
      echo "== $stage ($variant): limit $limit s"
      WORK=$local/work EXPERIMENT="experiments/paper_table1_official.py:$tiny$variant" \
        ROWS="0,1,2" THROUGHPUT=0 PYTHON="$PYTHON" \
        "$here/gpu_campaign.sh" "$data" "$local/$stage" "$limit" ;;
    c)
      limit=$(capped "${C_SECONDS:-120}")
      echo "== c (profile): limit $limit s"
      timeout -k 20 "$limit" env STAGES=profile PROFILE_MODELS=capsnet_text \
        PROFILE_BATCHES="$small" "$here/gpu_speed.sh" "$local/c" 2 ;;
    d)
      limit=$(capped "${D_SECONDS:-150}")
      echo "== d (pairs beside torch.compile): limit $limit s"
      timeout -k 20 "$limit" env STAGES=peer PEER_DEFAULT=0 PEER_BATCHES="$small" \
        PEER_PYTHON="$PYTHON" "$here/gpu_speed.sh" "$local/d" 2 ;;
    *) echo "unknown stage '$stage': the stages are a, b, c and d" >&2; exit 2 ;;
  esac
  pack
done
cat "$out/summary.md"
echo "== sitting done in $(($(date +%s) - start)) s"
