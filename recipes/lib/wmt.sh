# The WMT English->German recipe, shared by recipes/wmt14_en_de/run.sh and
# recipes/wmt17_en_de/run.sh (source it; bash). The caller sets
#   RECIPE    name (results/<RECIPE>, work/<RECIPE>)
#   CORPORA   array of "name url member.en member.de" (training corpora)
#   DEV, TEST "name url source-member reference-member" (.sgm members become plain text)
#   TEST_ABOUT  what the test set is (goes into the result JSON as test_set)
#   TEST_FILTERED, TEST_FILTERED_ABOUT (optional) a second test set, scored too
#               (WMT14: the filtered newstest2014 of Luong et al.)
# and calls `wmt_main "$@"`. Stages: prepare clean spm binarize train generate score (all).
# Every setting is an environment variable; recipes/README.md lists them with defaults.

. "$(dirname "${BASH_SOURCE[0]}")/stage.sh"
. "$(dirname "${BASH_SOURCE[0]}")/wmt_settings.sh"  # wmt_settings, wmt_validate
. "$(dirname "${BASH_SOURCE[0]}")/wmt_quality.sh"   # the extra stage `quality` (not in all)

WMT_STAGES="prepare clean spm binarize train generate score"

is_hybrid() { [[ $ARCH == hybrid_* ]]; }

# The URL a real URL is fetched from: MIRROR/<base name> when MIRROR is set.
source_url() { if [ -n "$MIRROR" ]; then printf '%s/%s\n' "${MIRROR%/}" "${1##*/}"; else printf '%s\n' "$1"; fi; }

all_urls() {
  local entry
  for entry in "${CORPORA[@]}" "$DEV" "$TEST" ${TEST_FILTERED:+"$TEST_FILTERED"}; do set -- $entry; printf '%s\n' "$2"; done | awk '!seen[$0]++'
}

# The test splits: test, and test_filtered when the recipe has a second test set.
test_splits() { echo test ${TEST_FILTERED:+test_filtered}; }

# The bytes the back-translations will take once extracted and pasted into train
# (two copies; a .gz file is counted as 4 times its size).
bt_bytes() {
  local f total=0 size
  for f in ${BT_EN:+"$BT_EN"} ${BT_DE:+"$BT_DE"}; do
    size=$(stat -c %s "$f")
    [[ $f == *.gz ]] && size=$((size * 4))
    total=$((total + 2 * size))
  done
  echo "$total"
}

# Fail early (one line) when the free space in DIR is under BYTES.
need_space() {
  local dir=$1 bytes=$2 what=$3 free
  mkdir -p "$dir"
  free=$(python -c "import shutil,sys; print(shutil.disk_usage(sys.argv[1]).free)" "$dir")
  [ "$free" -ge "$bytes" ] || die "$what: not enough disk space in $dir: about $((bytes / 1000000)) MB needed, $((free / 1000000)) MB free (set DATA_DIR)"
}

dir_bytes() { du -sb "$@" | awk '{s += $1} END {print s + 0}'; }

# same_lines STAGE FILE...: stop STAGE unless every FILE has as many lines as the first
# (a lost or split line would pair every later sentence with the wrong one).
same_lines() {
  local stage=$1 first=$2 n m f
  shift 2
  n=$(wc -l < "$first")
  for f in "$@"; do
    m=$(wc -l < "$f")
    [ "$m" = "$n" ] || die "$stage: $f has $m lines but $first has $n: the sides are out of step"
  done
}

prepare_stage() {
  local out=$DATA_DIR/raw entry urls=() fetch=() url i=0 name sha
  stage_needed prepare "$out" || return 0
  log "prepare: $(stage_plan prepare)"
  mapfile -t urls < <(all_urls)
  for url in "${urls[@]}"; do fetch+=("$(source_url "$url")"); done
  python "$LIB/wmt_data.py" probe --checksums "$CHECKSUMS" --downloads "$DOWNLOADS" \
    --extra-bytes "$(bt_bytes)" "${fetch[@]}"
  for url in "${fetch[@]}"; do
    i=$((i + 1)); name=${url##*/}
    sha=$(python "$LIB/wmt_data.py" sha256 --checksums "$CHECKSUMS" "$name")
    log "prepare: download $i/${#fetch[@]}: $name from $url"
    case $sha in   # md5 where that is all that is published (WMT14's test-filtered.tgz)
      md5:*) python "$LIB/download.py" --url "$url" --dest "$DOWNLOADS/$name" --md5 "${sha#md5:}" --retries "$RETRIES" ;;
      *) python "$LIB/download.py" --url "$url" --dest "$DOWNLOADS/$name" --sha256 "$sha" --retries "$RETRIES" ;;
    esac
  done
  local tmp; tmp=$(stage_begin "$out")
  local parts=()
  for entry in "${CORPORA[@]}"; do
    set -- $entry
    log "prepare: extracting $1 from ${2##*/}"
    python "$LIB/wmt_data.py" extract "$DOWNLOADS/${2##*/}" "$3=$tmp/parts/$1.en" "$4=$tmp/parts/$1.de"
    log "prepare: $1: $(wc -l < "$tmp/parts/$1.en") pairs"
    parts+=("$tmp/parts/$1")
  done
  if [ -n "$BT_EN" ]; then
    log "prepare: adding back-translated data $BT_EN / $BT_DE"
    python "$LIB/wmt_data.py" extract "$BT_EN" "x=$tmp/parts/backtranslation.en"
    python "$LIB/wmt_data.py" extract "$BT_DE" "x=$tmp/parts/backtranslation.de"
    log "prepare: backtranslation: $(wc -l < "$tmp/parts/backtranslation.en") pairs"
    parts+=("$tmp/parts/backtranslation")
  fi
  python "$LIB/wmt_data.py" paste --out "$tmp/train" "${parts[@]}"
  local split
  for split in valid $(test_splits); do
    case $split in valid) set -- $DEV ;; test) set -- $TEST ;; test_filtered) set -- $TEST_FILTERED ;; esac
    python "$LIB/wmt_data.py" extract "$DOWNLOADS/${2##*/}" "$3=$tmp/$split.en" "$4=$tmp/$split.de"
    python "$LIB/wmt_data.py" paste --out "$tmp/$split.check" "$tmp/$split" >/dev/null
    rm -f "$tmp/$split.check".*
    log "prepare: $split = $1: $(wc -l < "$tmp/$split.en") sentences"
    echo "$1" > "$tmp/$split.name"
  done
  rm -rf "$tmp/parts"
  log "prepare: train: $(wc -l < "$tmp/train.en") pairs in all"
  stage_commit prepare "$out"
}

clean_stage() {
  local out=$DATA_DIR/clean raw=$DATA_DIR/raw
  stage_needed clean "$out" "$raw" "the prepare stage" || return 0
  need_space "$DATA_DIR" $((2 * $(dir_bytes "$raw"))) clean
  local tmp; tmp=$(stage_begin "$out")
  log "clean: $(stage_plan clean)"
  python "$LIB/clean.py" text --filter --src "$raw/train.en" --tgt "$raw/train.de" --out-prefix "$tmp/train" \
    --max-words "$MAX_WORDS" --max-ratio "$MAX_RATIO" --stats "$tmp/train.stats.json" --what "clean train"
  same_lines clean "$tmp/train.en" "$tmp/train.de"
  for split in valid $(test_splits); do   # dev and test keep every line
    python "$LIB/clean.py" text --src "$raw/$split.en" --tgt "$raw/$split.de" --out-prefix "$tmp/$split" --what "normalise $split"
    same_lines clean "$raw/$split.en" "$tmp/$split.en" "$tmp/$split.de"
  done
  for split in $(test_splits); do
    cp "$raw/$split.de" "$tmp/$split.ref.de"   # untouched references for sacreBLEU
    cp "$raw/$split.name" "$tmp/$split.name"
  done
  stage_commit clean "$out"
}

spm_stage() {
  local out=$DATA_DIR/spm in=$DATA_DIR/clean
  stage_needed spm "$out" "$in" "the clean stage" || return 0
  need_space "$DATA_DIR" $((2 * $(dir_bytes "$in"))) spm
  local tmp; tmp=$(stage_begin "$out")
  log "spm: $(stage_plan spm)"
  python "$LIB/spm.py" train --vocab "$SPM_VOCAB" --model-prefix "$tmp/spm" --sample-size "$SPM_SAMPLE" \
    --threads "$WORKERS" "$in/train.en" "$in/train.de"
  local pids=() split lang pid
  for split in train valid $(test_splits); do
    for lang in en de; do
      local dest=$tmp/$split.$lang
      [ "$split" = train ] && dest=$tmp/train_all.$lang
      python "$LIB/spm.py" encode --model "$tmp/spm.model" "$in/$split.$lang" "$dest" & pids+=($!)
    done
  done
  log "spm: encoding train, valid and test ($(wc -l < "$in/train.en") training pairs)"
  for pid in "${pids[@]}"; do wait "$pid" || die "spm: encoding failed (see above)"; done
  same_lines spm "$in/train.en" "$tmp/train_all.en" "$tmp/train_all.de"
  for split in valid $(test_splits); do same_lines spm "$in/$split.en" "$tmp/$split.en" "$tmp/$split.de"; done
  python "$LIB/clean.py" subwords --src "$tmp/train_all.en" --tgt "$tmp/train_all.de" --out-prefix "$tmp/train" \
    --max-subwords "$MAX_SUBWORDS" --stats "$tmp/train.stats.json" --what "spm train"
  same_lines spm "$tmp/train.en" "$tmp/train.de"
  rm -f "$tmp/train_all.en" "$tmp/train_all.de"
  stage_commit spm "$out"
}

binarize_stage() {
  local out=$DATA_DIR/bin in=$DATA_DIR/spm
  stage_needed binarize "$out" "$in" "the spm stage" || return 0
  need_space "$DATA_DIR" $((2 * $(dir_bytes "$in"))) binarize
  local tmp; tmp=$(stage_begin "$out")
  log "binarize: $(stage_plan binarize)"
  # a second test set becomes fairseq's subset test1
  fairseq-preprocess --source-lang en --target-lang de \
    --trainpref "$in/train" --validpref "$in/valid" --testpref "$in/test${TEST_FILTERED:+,$in/test_filtered}" \
    --destdir "$tmp" --joined-dictionary --workers "$WORKERS" > "$tmp/preprocess.log" 2>&1 \
    || die "binarize: fairseq-preprocess failed: $(tail -1 "$tmp/preprocess.log")"
  grep -E "\[(en|de)\] .*sents|Wrote" "$tmp/preprocess.log" | sed -E 's/^.*fairseq_cli.preprocess( \| |:)/  /' >&2 || true
  local split lang read lines
  for split in train valid $(test_splits); do   # fairseq-preprocess reads lines its own way: compare
    for lang in en de; do
      read=$(grep -F "[$lang] $in/$split.$lang: " "$tmp/preprocess.log" | sed -E 's/^.*: ([0-9]+) sents.*$/\1/' | tail -1)
      lines=$(wc -l < "$in/$split.$lang")
      [ "$read" = "$lines" ] || die "binarize: fairseq-preprocess read ${read:-no} sentences from $in/$split.$lang, which has $lines lines"
    done
  done
  stage_commit binarize "$out"
}

# fairseq options that put the model on GPUS (hybrid: all of them; baseline: the first).
device_args() {
  if [ "$DEVICE_KIND" = cpu ]; then
    if is_hybrid && [ "$1" = train ]; then printf -- '--hybrid-devices %s ' "$DEVICES"; fi
    printf -- '--cpu'
  elif is_hybrid && [ "$1" = train ]; then
    printf -- '--hybrid-devices %s' "$DEVICES"
  fi
}

device_env() {   # the baseline, and generation, run on one GPU: the first of GPUS
  if [ "$DEVICE_KIND" = cuda ] && { ! is_hybrid || [ "$1" != train ]; }; then
    printf 'CUDA_VISIBLE_DEVICES=%s' "$FIRST_GPU"
  fi
}

# The training command (before EXTRA_TRAIN_ARGS) for FRONTEND=cli or hydra, in TRAIN_CMD.
train_command() {
  local out=$1 bin=$2 criterion
  if [ "$FRONTEND" = hydra ]; then   # recipes/config/hybrid_lstm_wmt_en_de.yaml holds the rest
    TRAIN_CMD=(fairseq-hydra-train --config-dir "$ROOT/recipes/config" --config-name hybrid_lstm_wmt_en_de
      "task.data=$(hydra_quote "$bin")" "checkpoint.save_dir=$(hydra_quote "$out")" "model._name=$ARCH"
      "model.hybrid_devices=$(hydra_quote "$DEVICES")" "common.cpu=$([ "$DEVICE_KIND" = cpu ] && echo true || echo false)"
      "criterion.label_smoothing=$LABEL_SMOOTHING" "model.dropout=$DROPOUT" "optimization.lr=[$LR]"
      "optimization.clip_norm=$CLIP_NORM" "dataset.max_tokens=$MAX_TOKENS" "optimization.max_update=$MAX_UPDATE"
      "checkpoint.save_interval_updates=$SAVE_INTERVAL" "checkpoint.keep_interval_updates=$AVG_N"
      "common.seed=$SEED" "common.log_interval=$LOG_INTERVAL")
    return
  fi
  if is_hybrid; then criterion="hybrid_cross_entropy"; else criterion="label_smoothed_cross_entropy"; fi
  # shellcheck disable=SC2046
  TRAIN_CMD=(fairseq-train "$bin" --user-dir "$USER_DIR"
    --arch "$ARCH" --criterion "$criterion" --label-smoothing "$LABEL_SMOOTHING"
    --dropout "$DROPOUT" --optimizer torch_adam --lr "$LR"
    --lr-scheduler reduce_lr_on_plateau --lr-shrink 0.5 --clip-norm "$CLIP_NORM"
    --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --required-batch-size-multiple 1
    --save-dir "$out" --no-epoch-checkpoints --save-interval-updates "$SAVE_INTERVAL"
    --keep-interval-updates "$AVG_N" --skip-invalid-size-inputs-valid-test
    --seed "$SEED" --log-format simple --log-interval "$LOG_INTERVAL" $(device_args train))
}

train_stage() {
  local out=$SAVE_DIR bin=$DATA_DIR/bin
  stage_needed "train ($ARCH)" "$out" "$bin" "the binarize stage" || return 0
  [ "${FORCE:-0}" = "1" ] && rm -rf "$out"
  mkdir -p "$out"   # no .tmp: an interrupted training resumes from checkpoint_last.pt
  [ -f "$out/checkpoint_last.pt" ] && log "train: resuming from $out/checkpoint_last.pt"
  train_command "$out" "$bin"
  log "train: $ARCH on $GPUS ($(device_args train)), max $MAX_TOKENS tokens a batch, $MAX_UPDATE updates (${TRAIN_CMD[0]})"
  # shellcheck disable=SC2046,SC2086
  if ! env $(device_env train) PYTHONUNBUFFERED=1 "${TRAIN_CMD[@]}" $EXTRA_TRAIN_ARGS 2>&1 | tee -a "$out/train.log" \
      | python -u "$LIB/train_progress.py" --max-update "$MAX_UPDATE"; then
    die "train: ${TRAIN_CMD[0]} failed: $(grep -E 'error|Error' "$out/train.log" | tail -1) (log: $out/train.log)"
  fi
  [ -f "$out/checkpoint_last.pt" ] || die "train: no checkpoint_last.pt in $out (log: $out/train.log)"
  date -u +%Y-%m-%dT%H:%M:%SZ > "$out/.done"
  log "train: done -> $out"
}

generate_stage() {
  local out=$GEN_DIR ckpt
  stage_needed "generate ($ARCH, $CHECKPOINT checkpoint)" "$out" "$SAVE_DIR" "the train stage (ARCH=$ARCH)" || return 0
  local tmp; tmp=$(stage_begin "$out")
  ckpt=$(generation_checkpoint "$CHECKPOINT" "$SAVE_DIR" "$AVG_N" "$tmp") || exit 1
  local split subset logfile start
  for split in $(test_splits); do
    subset=test; logfile=$tmp/generate.log
    [ "$split" = test_filtered ] && subset=test1 && logfile=$tmp/generate.test_filtered.log
    log "generate: beam $BEAM on the $(wc -l < "$DATA_DIR/clean/$split.en") sentences of $(cat "$DATA_DIR/clean/$split.name") with $ckpt"
    start=$SECONDS
    # shellcheck disable=SC2046
    env $(device_env generate) fairseq-generate "$DATA_DIR/bin" --user-dir "$USER_DIR" \
      --path "$ckpt" --gen-subset "$subset" --source-lang en --target-lang de \
      --beam "$BEAM" --lenpen "$LENPEN" --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B" \
      --batch-size "$GEN_BATCH" --required-batch-size-multiple 1 \
      --remove-bpe sentencepiece $(device_args generate) > "$tmp/$split.out" 2> "$logfile" \
      || die "generate: fairseq-generate failed: $(grep -E 'error|Error' "$logfile" | tail -1) (log: $logfile)"
    echo $((SECONDS - start)) > "$tmp/$split.seconds"
    grep -E "Translated" "$logfile" | sed -E 's/^.*fairseq_cli.generate( \| |:)/  /' >&2 || true
  done
  rm -f "$tmp/checkpoint_avg.pt"
  stage_commit generate "$out"
}

# The result JSON of a test split: RESULT_JSON for test, ...-filtered.json for test_filtered.
result_json() { if [ "$1" = test ]; then echo "$RESULT_JSON"; else echo "${RESULT_JSON%.json}-filtered.json"; fi; }

score_stage() {
  if [ "${FORCE:-0}" != 1 ] && [ -f "$RESULT_JSON" ] && [ "$RESULT_JSON" -nt "$GEN_DIR/.done" ]; then
    log "score: done already ($RESULT_JSON), skipping (FORCE=1 redoes it)"
    return 0
  fi
  require_done score "$GEN_DIR" "the generate stage"
  local split about
  for split in $(test_splits); do
    about=$TEST_ABOUT
    [ "$split" = test_filtered ] && about=$TEST_FILTERED_ABOUT
    [ -n "$about" ] || about=$(cat "$DATA_DIR/clean/$split.name")
    log "score: $about: sacreBLEU (detokenized) and tokenized BLEU with compound splitting"
    python "$LIB/wmt_score.py" --generate-output "$GEN_DIR/$split.out" --reference "$DATA_DIR/clean/$split.ref.de" \
      --json "$(result_json "$split")" --lang de --extra "$(printf '{"recipe": "%s", "test_set": "%s", "arch": "%s", "checkpoint": "%s", "beam": %s, "gpus": "%s", "max_tokens": %s, "max_update": %s, "spm_vocab": %s, "generate_seconds": %s}' \
        "$RECIPE" "$about" "$ARCH" "$CHECKPOINT" "$BEAM" "$GPUS" "$MAX_TOKENS" "$MAX_UPDATE" "$SPM_VOCAB" "$(cat "$GEN_DIR/$split.seconds")")"
  done
}

# What each stage does, in one line: the stage logs it when it starts and DRY_RUN=1 prints it.
stage_plan() {
  case $1 in
    prepare) echo "download (resumable, sha256 or md5 from $CHECKSUMS) and extract the corpora" ;;
    clean) echo "sacremoses punctuation normalisation, non-printing characters to spaces; drop empty pairs, > $MAX_WORDS words, length ratio > $MAX_RATIO, duplicates" ;;
    spm) echo "sentencepiece: a joint $SPM_VOCAB-piece model on up to $SPM_SAMPLE sampled sentences of train.en + train.de; drop pairs > $MAX_SUBWORDS subwords" ;;
    binarize) echo "fairseq-preprocess --joined-dictionary --workers $WORKERS" ;;
    train)
      if [ "$FRONTEND" = hydra ]; then
        echo "fairseq-hydra-train --config-name hybrid_lstm_wmt_en_de model._name=$ARCH model.hybrid_devices='$DEVICES' dataset.max_tokens=$MAX_TOKENS optimization.max_update=$MAX_UPDATE -> $SAVE_DIR"
      else
        local env; env=$(device_env train)
        echo "${env:+$env }fairseq-train --arch $ARCH $(device_args train) --max-tokens $MAX_TOKENS --max-update $MAX_UPDATE -> $SAVE_DIR"
      fi ;;
    generate) echo "fairseq-generate --beam $BEAM, $CHECKPOINT checkpoint -> $GEN_DIR" ;;
    score) echo "sacreBLEU (detokenized) and tokenized BLEU with compound splitting -> $(for split in $(test_splits); do result_json "$split"; done | paste -sd' ')" ;;
    quality) quality_plan ;;
  esac
}

plan_status() { if [ -f "$1/.done" ] && [ "${FORCE:-0}" != 1 ]; then echo "done, would skip"; else echo "would run"; fi; }

dry_run() {
  local stage=$1 stages=$1 url name sha size entry status
  [ "$stage" = all ] && stages=$WMT_STAGES
  echo "DRY_RUN: plan for $RECIPE (nothing is done), DATA_DIR=$DATA_DIR"
  for stage in $stages; do
    case $stage in
      prepare) status=$(plan_status "$DATA_DIR/raw") ;;
      clean|spm|binarize) status=$(plan_status "$DATA_DIR/$([ "$stage" = binarize ] && echo bin || echo "$stage")") ;;
      train) status=$(plan_status "$SAVE_DIR") ;;
      generate) status=$(plan_status "$GEN_DIR") ;;
      score|quality) status="would run" ;;
    esac
    printf '%-9s [%s] %s\n' "$stage" "$status" "$(stage_plan "$stage")"
    if [ "$stage" = prepare ]; then   # the files, and which corpus each split comes from
      for url in $(all_urls); do
        name=${url##*/}
        read -r sha size < <(awk -F'\t' -v n="$name" '$1 == n {print $2, $3}' "$CHECKSUMS")
        case $sha in md5:*) ;; *) sha=${sha:+sha256:$sha} ;; esac
        printf '            %s  (%s bytes, %s)\n' "$url" "${size:-?}" "${sha:-MISSING}"
        [ -n "$MIRROR" ] && printf '              fetched from %s\n' "$(source_url "$url")"
      done
      for entry in "${CORPORA[@]}"; do set -- $entry; echo "            train: $1 <- ${2##*/}: $3, $4"; done
      set -- $DEV; echo "            valid: $1 <- ${2##*/}: $3, $4"
      set -- $TEST; echo "            test:  $1 <- ${2##*/}: $3, $4"
      if [ -n "$TEST_FILTERED" ]; then set -- $TEST_FILTERED; echo "            test:  $1 <- ${2##*/}: $3, $4"; fi
      [ -n "$BT_EN" ] && echo "            train: back-translation <- $BT_EN, $BT_DE"
    fi
  done
}

wmt_main() {
  local stage=${1:-all}
  [ $# -le 1 ] || die "one stage at a time: use one of: $WMT_STAGES all"
  wmt_settings
  wmt_validate "$stage"
  if [ "$DRY_RUN" = 1 ]; then dry_run "$stage"; return 0; fi
  mkdir -p "$DATA_DIR"
  log "$RECIPE: stage $stage, DATA_DIR=$DATA_DIR${MIRROR:+, MIRROR=$MIRROR}"
  case "$stage" in
    all) for stage in $WMT_STAGES; do "${stage}_stage"; done ;;
    *) "${stage}_stage" ;;
  esac
}
