#!/usr/bin/env bash
# The prepared GPU sitting of Table 1's headline row as the authors' code ran it
# (experiments/paper_table1_official.py), stages in this order, each stopped by SIGTERM at its
# limit (which saves its runs: the same command on the same machine continues them):
#   a. configs/mnist.py:official, 3 seeds as one vectorised program, the paper's 50 epochs;
#   b. the paper's config with only the margin loss's scale as the code has it, 3 seeds;
#   c. :official, seed 0, 150,000 steps (the code's budget is 300,000).
# Each test set evaluation every 1,500 steps fills results.md's comparison-only column.
#
#   experiments/gpu_official.sh /path/to/mnist OUT_DIR [SECONDS]
#
# TINY=1: the same stages on the smoke model for a few steps (a dry run on a CPU).
set -uo pipefail
data=$1
out=$2
budget=${3:-560}
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
tiny=$([[ ${TINY:-0} != 0 ]] && echo "tiny" || echo "")
rows_variant=${tiny:+:$tiny}
budget_variant=:${tiny:+${tiny}_}budget
EXPERIMENT="experiments/paper_table1_official.py$rows_variant" ROWS="0,1,2 3,4,5" THROUGHPUT=0 \
  "$here/gpu_campaign.sh" "$data" "$out" "$budget"
EXPERIMENT="experiments/paper_table1_official.py$budget_variant" ROWS="0" THROUGHPUT=0 \
  "$here/gpu_campaign.sh" "$data" "$out" $((budget - ($(date +%s) - start)))
