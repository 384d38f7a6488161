"""The corpus scripts' reference: with DOCTOR_CORPUS_DUMP=path and DOCTOR_CORPUS_STEP=n set, a
script saves its leaf gradients at step n to path and ends (the tests compare a fixed script's
gradients with the original's there)."""

import os
import sys

import torch


def dump(step: int, grads: dict) -> None:
    path = os.environ.get("DOCTOR_CORPUS_DUMP")
    if path and step == int(os.environ.get("DOCTOR_CORPUS_STEP", "1")):
        torch.save({k: None if g is None else g.detach().clone() for k, g in grads.items()}, path)
        sys.exit(0)
