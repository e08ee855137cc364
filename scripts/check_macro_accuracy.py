#!/usr/bin/env python3
"""attnlab's macro accuracy against torchmetrics' own (issue 31): not part of CI.

attnlab scores MAD's runs with torchmetrics' `MulticlassAccuracy` default (average="macro"),
re-implemented in `ClassCounts::macro_accuracy` (src/train/trainer.rs). This script computes
torchmetrics' value on the docstring's hand case and on a random case that the Rust test
`macro_accuracy_matches_torchmetrics_on_a_random_case` builds from the same integer generator,
and prints both; the test pins the random case's value printed here.

    python3 -m venv venv && venv/bin/pip install torch torchmetrics
    venv/bin/python scripts/check_macro_accuracy.py
"""

import torch
from torchmetrics.classification import MulticlassAccuracy

# The random case: 1,000 positions, targets in 0..17, predictions in 0..20 (classes 17-19 are
# only ever predicted, which torchmetrics counts as 0), every tenth-or-so position ignored
# (-100, as MAD's labels), 60 % of the others predicted right.
N, TARGET_CLASSES, CLASSES, SEED = 1000, 17, 20, 12345


def lcg(seed):
    """Numerical Recipes' 32-bit linear congruential generator: the same numbers in Rust."""
    x = seed
    while True:
        x = (1664525 * x + 1013904223) % 2**32
        yield x


def random_case():
    g = lcg(SEED)
    targets, predictions = [], []
    for _ in range(N):
        t = next(g) % TARGET_CLASSES
        ignored = (next(g) >> 16) % 10 == 0
        r = next(g)
        p = t if (r >> 8) % 10 < 6 else (r >> 16) % CLASSES
        targets.append(-100 if ignored else t)
        predictions.append(p)
    return torch.tensor(predictions), torch.tensor(targets)


def macro(predictions, targets, classes):
    metric = MulticlassAccuracy(num_classes=classes, ignore_index=-100)
    return metric(predictions, targets).item()


def micro(predictions, targets, classes):
    metric = MulticlassAccuracy(num_classes=classes, ignore_index=-100, average="micro")
    return metric(predictions, targets).item()


hand = (torch.tensor([2, 1, 0, 1]), torch.tensor([2, 1, 0, 0]))
print(f"hand case: macro {macro(*hand, 3):.6f} (attnlab 5/6 = 0.833333), micro {micro(*hand, 3)}")
case = random_case()
print(f"random case: macro {macro(*case, CLASSES):.9f}, micro {micro(*case, CLASSES):.9f}")
