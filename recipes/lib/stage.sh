# Shared stage bookkeeping for the recipes (source it; bash).
# A stage's output directory gets a `.done` marker written last; a stage whose marker
# exists is skipped unless FORCE=1. Outputs are built in DIR.tmp and renamed into place,
# so an interrupted stage never leaves a half-written DIR behind.

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# stage_needed NAME DIR [INPUT WHAT]: true when DIR must be (re)built; then, before anything
# is logged, stop with one line unless INPUT holds a finished stage's output (WHAT makes it).
stage_needed() {
  local name=$1 dir=$2
  if [ "${FORCE:-0}" != "1" ] && [ -f "$dir/.done" ]; then
    log "$name: done already ($dir), skipping (FORCE=1 redoes it)"
    return 1
  fi
  [ $# -lt 4 ] || require_done "${name%% *}" "$3" "$4"
  log "$name: starting"
  return 0
}

# stage_begin DIR: prints the temporary directory to build DIR in (fresh, empty).
stage_begin() {
  local dir=$1
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp"
  printf '%s\n' "$dir.tmp"
}

# stage_commit NAME DIR: move DIR.tmp into place and write the marker last.
stage_commit() {
  local name=$1 dir=$2
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
  date -u +%Y-%m-%dT%H:%M:%SZ > "$dir/.done"
  log "$name: done -> $dir"
}

# require_done STAGE DIR WHAT: stop STAGE unless DIR holds a finished stage's output.
require_done() {
  [ -f "$2/.done" ] || die "$1: $2 is not complete: run $3 first"
}

# require_checkpoint NAME: the setting NAME names the checkpoint to translate with: best, last
# or avg (see generation_checkpoint).
require_checkpoint() {
  case "${!1}" in best|last|avg) ;;
    *) die "$1='${!1}': use best, last or avg (average of the last AVG_N saved)" ;; esac
}

# generation_checkpoint KIND SAVE_DIR AVG_N TMP: print the checkpoint to translate with:
# SAVE_DIR/checkpoint_best.pt or checkpoint_last.pt (KIND best, last), or (avg) the parameter
# average of the last AVG_N checkpoint_<epoch>_<updates>.pt of SAVE_DIR, written to
# TMP/checkpoint_avg.pt by recipes/lib/average.py. Call as ckpt=$(...) || exit 1.
generation_checkpoint() {
  local kind=$1 save_dir=$2 avg_n=$3 tmp=$4 ckpt saved=()
  case "$kind" in
    best|last) ckpt=$save_dir/checkpoint_$kind.pt ;;
    avg)
      mapfile -t saved < <(ls -1 "$save_dir" | grep -E '^checkpoint_[0-9]+_[0-9]+[.]pt$' | sort -t_ -k3 -n \
                             | tail -n "$avg_n" | sed "s|^|$save_dir/|")
      [ "${#saved[@]}" -gt 0 ] || die "generate: no checkpoint_<epoch>_<updates>.pt in $save_dir to average (use CHECKPOINT=best or last)"
      log "generate: averaging the last ${#saved[@]} saved checkpoints: ${saved[*]##*/}"
      ckpt=$tmp/checkpoint_avg.pt
      python "$(dirname "${BASH_SOURCE[0]}")/average.py" --out "$ckpt" "${saved[@]}" >&2 || exit 1 ;;
  esac
  [ -f "$ckpt" ] || die "generate: $ckpt does not exist"
  printf '%s\n' "$ckpt"
}

# require_int NAME... [-min N]: each setting NAME (a shell variable) is an integer >= N (1),
# rewritten without leading zeros (bash arithmetic reads 08 as a bad octal number).
require_int() {
  local min=1 name value names=()
  while [ $# -gt 0 ]; do
    if [ "$1" = -min ]; then min=$2; shift 2; else names+=("$1"); shift; fi
  done
  for name in "${names[@]}"; do
    value=${!name}
    [[ $value =~ ^[0-9]{1,15}$ ]] && [ "$((10#$value))" -ge "$min" ] || die "$name='$value': must be an integer >= $min"
    printf -v "$name" '%s' "$((10#$value))"
  done
}

# require_float KIND NAME...: each setting NAME is a finite number as Python's float() reads
# it (0.001, 1e-3, .5), rewritten in Python's plain form (0.001, 1e-05, 2) for the tools and
# the result JSON; KIND is positive (> 0), non-negative (>= 0) or fraction (>= 0 and < 1).
require_float() {
  local kind=$1 name value checked py pairs=()
  shift
  for name in "$@"; do pairs+=("$name" "${!name}"); done
  py=$(command -v python3 || command -v python) || die "python not found on PATH: run 'make install' and use .venv/bin"
  checked=$("$py" - "$kind" "${pairs[@]}" <<'PY'
import math, sys
kind, given = sys.argv[1], sys.argv[2:]
what, fits = {"positive": ("a number > 0", lambda v: v > 0),
              "non-negative": ("a number >= 0", lambda v: v >= 0),
              "fraction": ("a number >= 0 and < 1", lambda v: 0 <= v < 1)}[kind]
for name, text in zip(given[::2], given[1::2]):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and fits(value)):
        sys.exit(f"error: {name}='{text}': must be {what}")
    plain = repr(value)
    print(f"{name}={plain[:-2] if plain.endswith('.0') else plain}")
PY
  ) || exit 1
  while IFS='=' read -r name value; do printf -v "$name" '%s' "$value"; done <<< "$checked"
}

# require_number NAME...: each setting NAME is a number >= 0 (see require_float).
require_number() { require_float non-negative "$@"; }

# require_positive NAME...: each setting NAME is a number > 0.
require_positive() { require_float positive "$@"; }

# require_flag NAME...: each setting NAME is 0 or 1 (unset: 0).
require_flag() {
  local name
  for name in "$@"; do
    case "${!name:-0}" in 0|1) ;; *) die "$name='${!name}': use 1 (yes) or 0 (no)" ;; esac
  done
}

# require_work_dir NAME...: each setting NAME is a directory the recipe can create or use and
# fairseq can read: no ':' (fairseq splits data and checkpoint paths at it), not a file.
require_work_dir() {
  local name value
  for name in "$@"; do
    value=${!name}
    [ -n "$value" ] || die "$name is empty: give a directory"
    [[ $value != *:* ]] || die "$name='$value': fairseq reads ':' in a data or checkpoint path as a list of paths: use a directory without ':'"
    [ ! -e "$value" ] || [ -d "$value" ] || die "$name='$value' is a file, not a directory"
  done
}

require_tool() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH: run 'make install' and use .venv/bin (or 'make demo')"
}

# hydra_quote VALUE: VALUE as one quoted string for a Hydra command-line override
# (key=VALUE): commas, spaces and brackets stay part of it.
hydra_quote() {
  printf "'%s'" "${1//\'/\\\'}"
}
