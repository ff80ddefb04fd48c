"""Checkpoint averaging: the decoder side's weights averaged over checkpoints of one run's family,
the encoder kept from one of them.

    python -m export.train.average --encoder runs/grc-en-nt-align/best.pt \
        --average runs/grc-en-nt-align/best.pt runs/grc-en-nt-align/last.pt runs/grc-en-nt/best.pt \
        --out runs/grc-en-nt-align/averaged.pt

Averaging the weights of nearby checkpoints (the ends of two stages that share their start) is a
cheap ensemble. Only the parameters outside `encoder.` are averaged, so the encoder's states are
exactly those of `--encoder`: a link head trained on them (export/link_head.py) stays valid for
the averaged model. The bridge and the attention's key projection are decoder-side parameters and
are averaged. The result is a checkpoint like best.pt; `s2s-train --skip-train --checkpoint NAME`
exports and evaluates it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from export.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from export.train.model import Seq2Seq

ENCODER = "encoder."


def average_decoders(encoder_from: Seq2Seq, models: Sequence[Seq2Seq]) -> Seq2Seq:
    """`encoder_from` with every non-encoder parameter replaced by its mean over `models` (all of
    one architecture); returns it, in eval mode."""
    if not models:
        raise ValueError("no checkpoints to average")
    state = encoder_from.state_dict()
    for model in models:
        if model.cfg != encoder_from.cfg:
            raise ValueError("checkpoints of different architectures cannot be averaged")
    states = [m.state_dict() for m in models]
    with torch.no_grad():
        for name, value in state.items():
            if name.startswith(ENCODER) or not value.is_floating_point():
                continue
            state[name] = torch.stack([s[name] for s in states]).mean(dim=0)
    encoder_from.load_state_dict(state)
    return encoder_from.eval()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--encoder", type=Path, required=True, help="the checkpoint whose encoder is kept"
    )
    p.add_argument("--average", type=Path, nargs="+", required=True, help="checkpoints to average")
    p.add_argument("--out", type=Path, required=True, help="the averaged checkpoint")
    args = p.parse_args(argv)
    try:
        base, meta = load_checkpoint(args.encoder)
        models = [load_checkpoint(path)[0] for path in args.average]
        averaged = average_decoders(base, models)
    except (CheckpointError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    meta = {
        **meta,
        "dev_bleu": None,  # the encoder checkpoint's dev score is not the average's
        "averaged": [str(path) for path in args.average],
        "encoder": str(args.encoder),
    }
    save_checkpoint(args.out, averaged, meta)
    print(f"wrote {args.out}: decoder averaged over {len(models)} checkpoints")
    return 0


if __name__ == "__main__":
    sys.exit(main())
