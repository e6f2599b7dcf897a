# The WMT recipes' `quality` stage (sourced by recipes/lib/wmt.sh): the quality study of
# benchmarks/quality.py (docs/quality.md) on the recipe's binarized data, with the WMT
# models and training (--preset wmt: lstm_luong_wmt_en_de, hybrid_lstm_wmt_en_de and
# hybrid_lstm_wmt_en_de --input-feeding; the recipe's MAX_TOKENS, LR, DROPOUT, CLIP_NORM
# and MAX_UPDATE as the budget), each run until patience stops it, on GPUS. Not part of
# `all`: it is QUALITY_SEEDS x 2 + QUALITY_IF_SEEDS full trainings. Rerunning it skips the
# finished runs and resumes an interrupted one. DRY_RUN=1 prints the command.

quality_settings() {
  QUALITY_SEEDS=${QUALITY_SEEDS:-1,2,3,4,5}
  QUALITY_IF_SEEDS=${QUALITY_IF_SEEDS:-3}
  QUALITY_PATIENCE=${QUALITY_PATIENCE:-4}
  QUALITY_LENPENS=${QUALITY_LENPENS:-0.6,0.8,1.0,1.2,1.4}
  QUALITY_THREADS=${QUALITY_THREADS:-4}
  QUALITY_ARGS=${QUALITY_ARGS:-}   # appended to the study's options (e.g. --report-only)
}

quality_validate() {
  [[ $QUALITY_SEEDS =~ ^[0-9]+(,[0-9]+)*$ ]] || die "QUALITY_SEEDS='$QUALITY_SEEDS': use seeds like 1,2,3,4,5"
  require_int QUALITY_PATIENCE QUALITY_THREADS
  require_int QUALITY_IF_SEEDS -min 0
  [[ $QUALITY_LENPENS =~ ^[0-9]+([.][0-9]+)?(,[0-9]+([.][0-9]+)?)*$ ]] || die "QUALITY_LENPENS='$QUALITY_LENPENS': use length penalties like 0.6,1.0,1.4"
  [ $((MAX_UPDATE % SAVE_INTERVAL)) = 0 ] || die "MAX_UPDATE=$MAX_UPDATE is not a multiple of SAVE_INTERVAL=$SAVE_INTERVAL (the study validates every SAVE_INTERVAL updates)"
}

# The study's command, in QUALITY_CMD (run from the repository root).
quality_command() {
  QUALITY_CMD=(python -m benchmarks.quality --preset wmt --data "$DATA_DIR/bin"
    --reference "$DATA_DIR/clean/test.ref.de" --source "$DATA_DIR/clean/test.en" --remove-bpe sentencepiece
    --hybrid-devices "$DEVICES" --max-tokens "$MAX_TOKENS" --lr "$LR" --dropout "$DROPOUT" --clip-norm "$CLIP_NORM"
    --max-update "$MAX_UPDATE" --interval "$SAVE_INTERVAL" --patience "$QUALITY_PATIENCE"
    --seeds "$QUALITY_SEEDS" --if-seeds "$QUALITY_IF_SEEDS" --lenpens "$QUALITY_LENPENS"
    --jobs 1 --threads "$QUALITY_THREADS" --work "$DATA_DIR/quality" --out "$RESULTS/quality" --name "$RECIPE")
  # shellcheck disable=SC2206
  QUALITY_CMD+=($QUALITY_ARGS)
}

quality_plan() {
  quality_command
  echo "the quality study (docs/quality.md), finished runs skipped: (cd $ROOT && ${QUALITY_CMD[*]})"
}

quality_stage() {
  require_done quality "$DATA_DIR/bin" "the binarize stage"
  quality_command
  log "quality: $(quality_plan)"
  (cd "$ROOT" && "${QUALITY_CMD[@]}") || die "quality: the study stopped (rerun the stage to continue; runs: $RESULTS/quality/runs/$RECIPE)"
}
