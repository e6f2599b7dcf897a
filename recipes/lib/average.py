"""Average the parameters of fairseq checkpoints (what fairseq's
scripts/average_checkpoints.py does; that script is not part of the installed package).

    python recipes/lib/average.py --out avg.pt CKPT...

The first checkpoint's state (args, optimizer history) is kept with the averaged model
weights; the result is written to a temporary file and renamed into place.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import List

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fairseq_hybrid  # noqa: E402,F401  (safe globals so fairseq checkpoints load)
from fairseq import checkpoint_utils  # noqa: E402


def average(paths: List[str], out: str) -> None:
    for path in paths:
        if not os.path.isfile(path):
            sys.exit(f"average.py: error: checkpoint {path!r} does not exist")
    total = None
    state = None
    for path in paths:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
        model = state["model"]
        if total is None:
            total = {k: v.clone().double() if v.is_floating_point() else v.clone()
                     for k, v in model.items()}
        else:
            if model.keys() != total.keys():
                sys.exit(f"average.py: error: {path} holds other parameters than {paths[0]}")
            other = next((k for k, v in model.items() if v.shape != total[k].shape), None)
            if other is not None:
                sys.exit(f"average.py: error: {path}'s {other} is {list(model[other].shape)}, "
                         f"{paths[0]}'s {list(total[other].shape)}: checkpoints of one training only")
            for k, v in model.items():
                if v.is_floating_point():
                    total[k] += v.double()
    assert state is not None and total is not None
    state["model"] = {k: (v / len(paths)).to(state["model"][k].dtype) if v.is_floating_point()
                      else v for k, v in total.items()}
    state["last_optimizer_state"] = None  # not meaningful for an average; keeps the file small
    directory = os.path.dirname(os.path.abspath(out))
    with tempfile.NamedTemporaryFile(dir=directory, delete=False, suffix=".pt") as tmp:
        try:
            torch.save(state, tmp)
        except BaseException:  # a full disk, Ctrl-C: no half-written file left
            os.unlink(tmp.name)
            raise
    os.replace(tmp.name, out)
    print(f"averaged {len(paths)} checkpoints -> {out}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("checkpoints", nargs="+")
    args = parser.parse_args()
    average(args.checkpoints, args.out)


if __name__ == "__main__":
    main()
