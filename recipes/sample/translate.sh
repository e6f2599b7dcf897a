# How the sample recipe translates (source it; bash): its generation settings and its
# fairseq-generate command, for run.sh's generate stage and choices.sh alike.
# Settings (environment): BEAM (5), LENPEN (1.0), MAX_LEN_A (1.5) and MAX_LEN_B (10: at most
# a x source length + b tokens); run.sh checks them.
BEAM=${BEAM:-5}
LENPEN=${LENPEN:-1.0}
MAX_LEN_A=${MAX_LEN_A:-1.5}
MAX_LEN_B=${MAX_LEN_B:-10}

# translate BIN CHECKPOINT SUBSET: fairseq-generate's output on stdout, its log on stderr.
translate() {
  fairseq-generate "$1" --user-dir "$ROOT/fairseq_hybrid" --path "$2" --gen-subset "$3" \
    --beam "$BEAM" --lenpen "$LENPEN" --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B" \
    --batch-size 64 --required-batch-size-multiple 1 --remove-bpe sentencepiece --num-workers 0
}
