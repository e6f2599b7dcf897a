# Shared stage bookkeeping for the recipes (source it; bash).
# A stage's output directory gets a `.done` marker written last; a stage whose marker
# exists is skipped unless FORCE=1. Outputs are built in DIR.tmp and renamed into place,
# so an interrupted stage never leaves a half-written DIR behind.

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# stage_needed NAME DIR: true when DIR must be (re)built.
stage_needed() {
  local name=$1 dir=$2
  if [ "${FORCE:-0}" != "1" ] && [ -f "$dir/.done" ]; then
    log "$name: done already ($dir), skipping (FORCE=1 redoes it)"
    return 1
  fi
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

# require_int NAME... [-min N]: each setting NAME (a shell variable) is an integer >= N (1).
require_int() {
  local min=1 name value names=()
  while [ $# -gt 0 ]; do
    if [ "$1" = -min ]; then min=$2; shift 2; else names+=("$1"); shift; fi
  done
  for name in "${names[@]}"; do
    value=${!name}
    [[ $value =~ ^[0-9]+$ ]] && [ "$value" -ge "$min" ] || die "$name='$value': must be an integer >= $min"
  done
}

# require_number NAME...: each setting NAME is a number >= 0 (digits, optionally a fraction).
require_number() {
  local name value
  for name in "$@"; do
    value=${!name}
    [[ $value =~ ^[0-9]+([.][0-9]+)?$ ]] || die "$name='$value': must be a number >= 0"
  done
}

# require_positive NAME...: each setting NAME is a number > 0.
require_positive() {
  local name value
  for name in "$@"; do
    value=${!name}
    [[ $value =~ ^[0-9]+([.][0-9]+)?$ ]] && [[ $value =~ [1-9] ]] || die "$name='$value': must be a number > 0"
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
