#!/usr/bin/env bash
# How the sample recipe's checkpoint choice and seed were chosen (docs/usage.md, "The sample
# recipe"): for each seed given, the recipe's own stages with every saved checkpoint kept
# (AVG_N=8), then the checkpoint with the best validation loss and the averages of the last
# 2, 3 and 4 saved checkpoints, each translated on the validation and the test set as the
# recipe translates (recipes/sample/translate.sh) and scored with
# sacreBLEU / chrF. One line per seed, checkpoint and set on stdout and in $OUT/choices.tsv.
#
#   bash recipes/sample/choices.sh 1 2 3 4 5      # ~13 minutes a seed on 2 CPU cores
#
# Settings: OUT (work/sample-choices), and the sample recipe's (MAX_UPDATE, INTERVAL, ...),
# passed through; TRAIN_MINUTES defaults to 60 here so that a busy machine still trains
# every update.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/recipes/lib/stage.sh"
. "$ROOT/recipes/sample/translate.sh"

OUT=${OUT:-$ROOT/work/sample-choices}
export TRAIN_MINUTES=${TRAIN_MINUTES:-60}
[ $# -gt 0 ] || die "give the seeds to run, e.g. 'bash recipes/sample/choices.sh 1 2 3 4 5'"
for SEED in "$@"; do require_int SEED -min 0; done
require_work_dir OUT
mkdir -p "$OUT"

for seed in "$@"; do
  work=$OUT/seed$seed
  for stage in spm binarize train; do
    WORK=$work RESULTS=$work/results SEED=$seed AVG_N=8 bash "$ROOT/recipes/sample/run.sh" "$stage"
  done
  for kind in best 2 3 4; do
    dir=$work/choice-$kind
    rm -rf "$dir"
    mkdir -p "$dir"
    if [ "$kind" = best ]; then
      ckpt=$(generation_checkpoint best "$work/checkpoints" 1 "$dir") || exit 1
    else
      ckpt=$(generation_checkpoint avg "$work/checkpoints" "$kind" "$dir") || exit 1
    fi
    for split in valid test; do
      translate "$work/bin" "$ckpt" "$split" > "$dir/$split.out" 2> "$dir/$split.log" \
        || die "seed $seed, $kind: fairseq-generate failed (log: $dir/$split.log)"
      python "$ROOT/recipes/lib/score.py" --generate-output "$dir/$split.out" \
        --reference "$ROOT/data/ende-sample/$split.de" --json "$dir/$split.json" > /dev/null
      python -c 'import json, sys; d = json.load(open(sys.argv[1])); print(*sys.argv[2:], d["bleu"], d["chrf"], sep="\t")' \
        "$dir/$split.json" "$seed" "$([ "$kind" = best ] && echo best || echo "average of last $kind")" "$split" \
        | tee -a "$OUT/choices.tsv"
    done
  done
done
