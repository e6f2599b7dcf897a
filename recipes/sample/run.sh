#!/usr/bin/env bash
# The bundled English->German sample, end to end on the CPU (what `make demo` runs):
# sentencepiece -> fairseq-preprocess -> fairseq-train hybrid_lstm -> fairseq-generate
# (beam 5) -> sacreBLEU/chrF on detokenized output -> results/sample/bleu.json.
#
# Stages: spm, binarize, train, generate, score (or all, the default):
#   bash recipes/sample/run.sh [all|spm|binarize|train|generate|score]
# Each stage skips when its output is complete; FORCE=1 redoes it.
# Settings (environment): WORK (work/sample), RESULTS (results/sample), SPM_VOCAB (3000),
# MAX_UPDATE (2500 updates; TRAIN_MINUTES (15) caps the time, and training stops earlier
# once the validation loss has not improved for PATIENCE (5) validations), INTERVAL (250:
# validate and save every this many updates), MAX_TOKENS (2000), LR (0.003), DROPOUT (0.3),
# SEED (3), CHECKPOINT (avg: the parameter average of the last AVG_N (3) saved checkpoints;
# or best, last), BEAM (5), LENPEN (1.0), MAX_LEN_A (1.5) and MAX_LEN_B (10: at most
# a x source length + b tokens),
# FRONTEND (cli: fairseq-train; hydra: fairseq-hydra-train with recipes/config/hybrid_lstm.yaml),
# DEVICE_ARGS (extra training options: fairseq-train's, e.g. "--cpu", or with
# FRONTEND=hydra Hydra overrides, e.g. "common.cpu=true").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/recipes/lib/stage.sh"
. "$ROOT/recipes/sample/translate.sh"   # BEAM, LENPEN, MAX_LEN_A, MAX_LEN_B and translate

DATA=$ROOT/data/ende-sample
WORK=${WORK:-$ROOT/work/sample}
RESULTS=${RESULTS:-$ROOT/results/sample}
SPM_VOCAB=${SPM_VOCAB:-3000}
MAX_UPDATE=${MAX_UPDATE:-2500}
TRAIN_MINUTES=${TRAIN_MINUTES:-15}
PATIENCE=${PATIENCE:-5}
INTERVAL=${INTERVAL:-250}
MAX_TOKENS=${MAX_TOKENS:-2000}
LR=${LR:-0.003}
DROPOUT=${DROPOUT:-0.3}
SEED=${SEED:-3}
CHECKPOINT=${CHECKPOINT:-avg}
AVG_N=${AVG_N:-3}
FRONTEND=${FRONTEND:-cli}
DEVICE_ARGS=${DEVICE_ARGS:-}
USER_DIR=$ROOT/fairseq_hybrid
STAGE=${1:-all}

case "$STAGE" in all|spm|binarize|train|generate|score) ;;
  *) die "unknown stage '$STAGE': use all, spm, binarize, train, generate or score" ;;
esac
[ $# -le 1 ] || die "one stage at a time ('$*'): use all, spm, binarize, train, generate or score"
case "$FRONTEND" in cli) TRAIN_TOOL=fairseq-train ;; hydra) TRAIN_TOOL=fairseq-hydra-train ;;
  *) die "FRONTEND='$FRONTEND': use cli (fairseq-train) or hydra (fairseq-hydra-train)" ;;
esac
for tool in python fairseq-preprocess "$TRAIN_TOOL" fairseq-generate; do require_tool "$tool"; done
# the same one-line checks as the WMT recipes (recipes/lib/stage.sh), before any work
require_positive TRAIN_MINUTES LR
require_float fraction DROPOUT
require_number LENPEN MAX_LEN_A
require_int SPM_VOCAB MAX_TOKENS -min 100
require_int BEAM MAX_UPDATE INTERVAL AVG_N
require_int MAX_LEN_B -min 0
require_checkpoint CHECKPOINT
require_int SEED -min 0
require_int PATIENCE
require_flag FORCE
require_work_dir WORK
[ ! -e "$RESULTS" ] || [ -d "$RESULTS" ] || die "RESULTS='$RESULTS' is a file, not a directory"

spm_stage() {
  local out=$WORK/spm
  stage_needed spm "$out" || return 0
  local tmp; tmp=$(stage_begin "$out")
  log "spm: training a joint ${SPM_VOCAB}-piece model on train.en + train.de"
  # spm.py says what went wrong in one line; nothing of the stage is left behind
  spm_py() { python "$ROOT/recipes/lib/spm.py" "$@" || { rm -rf "$tmp"; exit 1; }; }
  spm_py train --vocab "$SPM_VOCAB" --model-prefix "$tmp/spm" "$DATA/train.en" "$DATA/train.de"
  for split in train valid test; do
    for lang in en de; do
      spm_py encode --model "$tmp/spm.model" "$DATA/$split.$lang" "$tmp/$split.$lang"
    done
    log "spm: encoded $split ($(wc -l < "$tmp/$split.en") pairs)"
  done
  stage_commit spm "$out"
}

binarize_stage() {
  local out=$WORK/bin
  stage_needed binarize "$out" "$WORK/spm" "the spm stage" || return 0
  local tmp; tmp=$(stage_begin "$out")
  fairseq-preprocess --source-lang en --target-lang de \
    --trainpref "$WORK/spm/train" --validpref "$WORK/spm/valid" --testpref "$WORK/spm/test" \
    --destdir "$tmp" --joined-dictionary --workers 2 > "$tmp/preprocess.log" 2>&1 \
    || die "binarize: fairseq-preprocess failed: $(grep -E 'error|Error' "$tmp/preprocess.log" | tail -1) (log: $tmp/preprocess.log)"
  grep -E "sents|Wrote" "$tmp/preprocess.log" >&2 || true
  stage_commit binarize "$out"
}

# train_settings: what the train stage trains with, as JSON fields for results/sample/bleu.json.
train_settings() {
  echo "\"train_minutes\": $TRAIN_MINUTES, \"max_update\": $MAX_UPDATE, \"seed\": $SEED"
}

train_stage() {
  local out=$WORK/checkpoints
  stage_needed train "$out" "$WORK/bin" "the binarize stage" || return 0
  [ "${FORCE:-0}" = "1" ] && rm -rf "$out"
  mkdir -p "$out"   # no .tmp here: an interrupted training resumes from checkpoint_last.pt
  log "train: hybrid_lstm (2+2 x 256) on $WORK/bin, $MAX_UPDATE updates (at most ${TRAIN_MINUTES} min; patience ${PATIENCE} validations of every $INTERVAL)"
  local hours; hours=$(python -c "print($TRAIN_MINUTES / 60)")
  local train=()
  if [ "$FRONTEND" = hydra ]; then   # the same settings, from recipes/config/hybrid_lstm.yaml
    train=(fairseq-hydra-train --config-dir "$ROOT/recipes/config" --config-name hybrid_lstm
      "task.data=$(hydra_quote "$WORK/bin")" "checkpoint.save_dir=$(hydra_quote "$out")"
      "model.dropout=$DROPOUT" "optimization.lr=[$LR]" "dataset.max_tokens=$MAX_TOKENS"
      "optimization.max_update=$MAX_UPDATE" "optimization.stop_time_hours=$hours" "checkpoint.patience=$PATIENCE"
      "dataset.validate_interval_updates=$INTERVAL" "checkpoint.save_interval_updates=$INTERVAL"
      "checkpoint.keep_interval_updates=$AVG_N" "common.seed=$SEED")
  else
    train=(fairseq-train "$WORK/bin" --user-dir "$USER_DIR"
      --arch hybrid_lstm --share-all-embeddings --dropout "$DROPOUT"
      --criterion hybrid_cross_entropy --label-smoothing 0.1
      --optimizer torch_adam --adam-betas '(0.9, 0.98)' --lr "$LR" --clip-norm 1.0
      --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --stop-time-hours "$hours" --patience "$PATIENCE"
      --max-epoch 200 --validate-interval 1000 --save-interval 1000
      --validate-interval-updates "$INTERVAL" --save-interval-updates "$INTERVAL" --keep-interval-updates "$AVG_N"
      --save-dir "$out" --no-epoch-checkpoints
      --required-batch-size-multiple 1 --num-workers 0 --seed "$SEED"
      --log-format simple --log-interval 100)
  fi
  # the progress lines on the terminal; a failure as its cause's line (log: train.log)
  # shellcheck disable=SC2086
  if ! PYTHONUNBUFFERED=1 "${train[@]}" $DEVICE_ARGS 2>&1 | tee "$out/train.log" \
    | { grep --line-buffered -E "\| INFO \| (train_inner|train|valid) \||\]\[(train_inner|train|valid)\]\[INFO\]|done training" >&2 || true; }; then
    die "train: $TRAIN_TOOL failed: $(grep -E 'error|Error' "$out/train.log" | tail -1) (log: $out/train.log)"
  fi
  [ -f "$out/checkpoint_best.pt" ] || die "train: no checkpoint_best.pt in $out (see $out/train.log)"
  train_settings > "$out/settings"   # for the score stage: a later run may skip this one
  date -u +%Y-%m-%dT%H:%M:%SZ > "$out/.done"
  log "train: done -> $out"
}

generate_stage() {
  local out=$WORK/generate
  stage_needed generate "$out" "$WORK/checkpoints" "the train stage" || return 0
  local tmp; tmp=$(stage_begin "$out")
  local ckpt; ckpt=$(generation_checkpoint "$CHECKPOINT" "$WORK/checkpoints" "$AVG_N" "$tmp") || exit 1
  log "generate: beam $BEAM on the $(wc -l < "$DATA/test.en") test sentences with $ckpt"
  local start=$SECONDS
  translate "$WORK/bin" "$ckpt" test > "$tmp/test.out" 2> "$tmp/generate.log" \
    || die "generate: fairseq-generate failed: $(grep -E 'error|Error' "$tmp/generate.log" | tail -1) (log: $tmp/generate.log)"
  echo $((SECONDS - start)) > "$tmp/seconds"
  echo "$BEAM" > "$tmp/beam"
  echo "$CHECKPOINT" > "$tmp/checkpoint"
  grep -E "Translated|BLEU" "$tmp/generate.log" "$tmp/test.out" | sed 's/^/  /' >&2 || true
  stage_commit generate "$out"
}

score_stage() {
  require_done score "$WORK/generate" "the generate stage"
  log "score: sacreBLEU and chrF of detokenized output against the raw references"
  # what the finished stages ran with (a stage skipped as done kept its own settings)
  local vocab=$SPM_VOCAB beam=$BEAM checkpoint=$CHECKPOINT
  local trained; trained=$(train_settings)
  [ -f "$WORK/checkpoints/settings" ] && trained=$(cat "$WORK/checkpoints/settings")
  [ -f "$WORK/spm/spm.vocab" ] && vocab=$(wc -l < "$WORK/spm/spm.vocab")
  [ -f "$WORK/generate/beam" ] && beam=$(cat "$WORK/generate/beam")
  [ -f "$WORK/generate/checkpoint" ] && checkpoint=$(cat "$WORK/generate/checkpoint")
  python "$ROOT/recipes/lib/score.py" --generate-output "$WORK/generate/test.out" \
    --reference "$DATA/test.de" --source "$DATA/test.en" --show 5 --json "$RESULTS/bleu.json" \
    --extra "{\"model\": \"hybrid_lstm\", \"spm_vocab\": $vocab, $trained, \"beam\": $beam, \"checkpoint\": \"$checkpoint\", \"generate_seconds\": $(cat "$WORK/generate/seconds")}"
}

case "$STAGE" in
  spm) spm_stage ;;
  binarize) binarize_stage ;;
  train) train_stage ;;
  generate) generate_stage ;;
  score) score_stage ;;
  all) spm_stage; binarize_stage; train_stage; generate_stage; score_stage ;;
esac
