# The WMT recipe's settings (wmt_settings: every environment variable with its default)
# and their checks (wmt_validate: one line and exit 1 for any bad setting, before any
# work). Sourced by wmt.sh.

wmt_settings() {
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  LIB=$ROOT/recipes/lib
  USER_DIR=$ROOT/fairseq_hybrid
  DATA_DIR=${DATA_DIR:-$ROOT/work/$RECIPE}
  RESULTS=${RESULTS:-$ROOT/results/$RECIPE}
  MIRROR=${MIRROR:-}
  CHECKSUMS=${CHECKSUMS:-$LIB/wmt_checksums.tsv}
  RETRIES=${RETRIES:-5}
  BT_EN=${BT_EN:-}
  BT_DE=${BT_DE:-}
  TEST_FILTERED=${TEST_FILTERED:-}
  TEST_ABOUT=${TEST_ABOUT:-}
  TEST_FILTERED_ABOUT=${TEST_FILTERED_ABOUT:-}
  MAX_WORDS=${MAX_WORDS:-80}
  MAX_RATIO=${MAX_RATIO:-1.5}
  MAX_SUBWORDS=${MAX_SUBWORDS:-250}
  SPM_VOCAB=${SPM_VOCAB:-32000}
  SPM_SAMPLE=${SPM_SAMPLE:-2000000}
  WORKERS=${WORKERS:-$(nproc 2>/dev/null || echo 4)}
  ARCH=${ARCH:-hybrid_lstm_wmt_en_de}
  GPUS=${GPUS:-0,1,2,3}
  MAX_TOKENS=${MAX_TOKENS:-8000}
  MAX_UPDATE=${MAX_UPDATE:-150000}
  LR=${LR:-0.001}
  DROPOUT=${DROPOUT:-0.2}
  CLIP_NORM=${CLIP_NORM:-5}
  LABEL_SMOOTHING=${LABEL_SMOOTHING:-0.1}
  SAVE_INTERVAL=${SAVE_INTERVAL:-5000}
  LOG_INTERVAL=${LOG_INTERVAL:-100}
  SEED=${SEED:-1}
  EXTRA_TRAIN_ARGS=${EXTRA_TRAIN_ARGS:-}
  FRONTEND=${FRONTEND:-cli}
  CHECKPOINT=${CHECKPOINT:-avg}
  AVG_N=${AVG_N:-5}
  BEAM=${BEAM:-5}
  LENPEN=${LENPEN:-1.0}
  GEN_BATCH=${GEN_BATCH:-64}
  MAX_LEN_A=${MAX_LEN_A:-1.5}
  MAX_LEN_B=${MAX_LEN_B:-10}
  DRY_RUN=${DRY_RUN:-0}
  DATA_DIR=$(realpath -m "$DATA_DIR")
  RESULTS=$(realpath -m "$RESULTS")
  DOWNLOADS=$DATA_DIR/downloads
  SAVE_DIR=$DATA_DIR/checkpoints/$ARCH
  GEN_DIR=$DATA_DIR/generate/$ARCH-$CHECKPOINT
  RESULT_JSON=$RESULTS/$ARCH-$CHECKPOINT.json
  quality_settings
}

# One line and exit 1 for any bad setting, before any work.
wmt_validate() {
  local stage=$1 name value
  case " $WMT_STAGES quality all " in *" $stage "*) ;;
    *) die "unknown stage '$stage': use one of: $WMT_STAGES all" ;; esac
  require_int RETRIES MAX_WORDS MAX_SUBWORDS SPM_SAMPLE WORKERS MAX_TOKENS MAX_UPDATE \
              SAVE_INTERVAL LOG_INTERVAL SEED AVG_N BEAM GEN_BATCH
  require_int SPM_VOCAB -min 100
  require_int MAX_LEN_B -min 0   # fairseq's --max-len-b is an integer
  require_positive MAX_RATIO LR
  require_float fraction DROPOUT LABEL_SMOOTHING
  require_number CLIP_NORM LENPEN MAX_LEN_A
  require_work_dir DATA_DIR
  require_flag FORCE DRY_RUN
  [ ! -e "$RESULTS" ] || [ -d "$RESULTS" ] || die "RESULTS='$RESULTS' is a file, not a directory"
  case "$ARCH" in hybrid_lstm_wmt_en_de|hybrid_lstm|lstm_luong_wmt_en_de|lstm) ;;
    *) die "ARCH='$ARCH': use hybrid_lstm_wmt_en_de (default), lstm_luong_wmt_en_de (the input-feeding baseline), hybrid_lstm or lstm" ;; esac
  case "$FRONTEND" in cli) ;;
    hydra) is_hybrid || die "FRONTEND=hydra trains the hybrid models (recipes/config/hybrid_lstm_wmt_en_de.yaml): ARCH='$ARCH' needs FRONTEND=cli" ;;
    *) die "FRONTEND='$FRONTEND': use cli (fairseq-train) or hydra (fairseq-hydra-train)" ;; esac
  require_checkpoint CHECKPOINT
  case "$MIRROR" in ""|file://*|http://*|https://*) ;;
    *) die "MIRROR='$MIRROR': use a file://, http:// or https:// URL (files are fetched from MIRROR/<name>)" ;; esac
  [ -f "$CHECKSUMS" ] || die "CHECKSUMS='$CHECKSUMS': no such file"
  if [ -n "$BT_EN$BT_DE" ]; then
    [ -n "$BT_EN" ] && [ -n "$BT_DE" ] || die "BT_EN and BT_DE go together (back-translation source and target files)"
    [ -f "$BT_EN" ] || die "BT_EN='$BT_EN': no such file"
    [ -f "$BT_DE" ] || die "BT_DE='$BT_DE': no such file"
  fi
  # GPUS: GPU indices (0,1,2,3 -> --hybrid-devices cuda:0,cuda:1,cuda:2,cuda:3) or cpu.
  if [[ $GPUS =~ ^cpu(,cpu)*$ ]]; then
    DEVICES=$GPUS
    DEVICE_KIND=cpu
  elif [[ $GPUS =~ ^[0-9]+(,[0-9]+)*$ ]]; then
    local dup; dup=$(tr , '\n' <<< "$GPUS" | sort | uniq -d | head -1)
    [ -z "$dup" ] || die "GPUS='$GPUS': GPU $dup is listed twice"
    DEVICES=$(sed -E 's/([0-9]+)/cuda:\1/g' <<< "$GPUS")
    DEVICE_KIND=cuda
  else
    die "GPUS='$GPUS': use GPU indices like 0,1,2,3 (one process drives them all) or cpu"
  fi
  FIRST_GPU=${GPUS%%,*}
  [ "$stage" != quality ] || quality_validate
  if [ "$DRY_RUN" != 1 ]; then
    require_tool python
    case "$stage" in binarize|train|generate|all)
      for name in fairseq-preprocess fairseq-train fairseq-generate; do require_tool "$name"; done
      [ "$FRONTEND" = cli ] || require_tool fairseq-hydra-train ;;
    esac
    if [ "$DEVICE_KIND" = cuda ] && { [ "$stage" = train ] || [ "$stage" = all ] || [ "$stage" = generate ]; }; then
      local have; have=$(python -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
      local highest; highest=$(tr , '\n' <<< "$GPUS" | sort -n | tail -1)
      [ "$highest" -lt "$have" ] || die "GPUS='$GPUS': this machine has $have CUDA device(s) (indices 0..$((have - 1))); set GPUS to those, or GPUS=cpu"
    fi
  fi
}
