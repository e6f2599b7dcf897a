"""Filter fairseq-train's (or fairseq-hydra-train's) log for the recipes: pass through
progress, validation and error lines, and add an ETA to each progress line from the update
rate seen so far.

    fairseq-train ... 2>&1 | tee train.log | python -u recipes/lib/train_progress.py --max-update N
"""
from __future__ import annotations

import argparse
import re
import sys
import time

SHOW = re.compile(
    r"\| INFO \| (train_inner|train|valid) \||\]\[(train_inner|train|valid)\]\[INFO\]|"  # cli|hydra
    r"done training|Error|error:|Traceback"
)
UPDATES = re.compile(r"num_updates[ =](\d+)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-update", type=int, required=True)
    args = parser.parse_args()
    first = None
    for line in sys.stdin:
        if not SHOW.search(line):
            continue
        line = line.rstrip("\n")
        match = UPDATES.search(line)
        if match:
            updates, now = int(match.group(1)), time.monotonic()
            if first is None:  # a resumed run starts counting here
                first = (updates, now)
            elif updates > first[0]:
                rate = (updates - first[0]) / (now - first[1])
                left = max(args.max_update - updates, 0) / rate
                line += (f" | {updates}/{args.max_update} updates, ETA {int(left // 3600)}:"
                         f"{int(left % 3600 // 60):02d} (h:mm)")
            else:
                line += f" | {updates}/{args.max_update} updates"
        print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
