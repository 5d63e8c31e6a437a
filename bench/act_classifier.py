"""How well the behaviour space's dialogue-act classifier labels persuadee sentences it never saw.

    python bench/act_classifier.py [--embedder FOLDER] [--test-share 0.2] [--seed 0]

`[behaviour] dialogue_acts` (training/measures/behaviour_space.py) fits a softmax regression on
the embeddings of P4G's annotated persuadee sentences (300_dialog.xlsx, ee_label_1) and labels
every simulator sentence with it; BDI and the act shares are only as good as those labels. Here
the annotated dialogues are split by dialogue (no dialogue in both parts: its sentences are
alike), the classifier is fit on one part exactly as the run fits it (same embedder, centring,
unit length, L2 and solver) and read on the other. Prints held-out accuracy and macro-F1 beside
the majority-class baseline, per-act recall, and, where the file has a second annotation
(ee_label_2), how often the two annotators agree on the same sentences: a ceiling of sorts.
Asserts nothing.

Commit dde5a3a, 2026-12-06 (load 5-9 from other work; the figures do not depend on it): 4,847
sentences, 23 acts, fit on 3,853 (240 dialogues), read on 994 (60): accuracy 0.424 (majority
class 0.226), macro-F1 0.191; recall 0.85 / 0.79 / 0.87 on the three most worded acts, 0.00 on
11 of the 23. 15 sentences labelled twice: the annotators agree on 4.
"""

import argparse
import os
import random
import subprocess
import time
from collections import Counter

import numpy as np

from agents.behaviour.space import fit_classifier, sentences
from training.measures.behaviour_space import p4g_folder


def annotated(folder) -> list[tuple[str, str, str, str | None]]:
    """(dialogue, sentence, ee_label_1, ee_label_2) of every labelled persuadee sentence."""
    import openpyxl

    book = openpyxl.load_workbook(folder / "300_dialog.xlsx", read_only=True)
    rows = book.active.iter_rows(values_only=True)
    header = list(next(rows))
    at = {name: header.index(name) for name in ("B2", "B4", "Unit", "ee_label_1", "ee_label_2")}
    found = []
    for r in rows:
        text = str(r[at["Unit"]] or "").strip()
        if r[at["B4"]] == 1 and r[at["ee_label_1"]] and text:
            second = r[at["ee_label_2"]]
            found.append(
                (
                    r[at["B2"]],
                    text,
                    str(r[at["ee_label_1"]]).strip(),
                    str(second).strip() if second else None,
                )
            )
    book.close()
    return found


def main() -> None:
    from agents.serving.prepare import ensure_base_model
    from training.measures.diversity import Embedder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--embedder", default="", help="a local model folder (default: the base model)"
    )
    parser.add_argument("--test-share", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"commit {commit}; load {os.getloadavg()[0]:.1f} (1 min) at start; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )

    rows = annotated(p4g_folder(""))
    dialogues = sorted({d for d, *_ in rows})
    random.Random(args.seed).shuffle(dialogues)
    held = set(dialogues[: round(len(dialogues) * args.test_share)])
    train = [r for r in rows if r[0] not in held]
    test = [r for r in rows if r[0] in held]
    names = sorted({r[2] for r in rows})
    print(
        f"{len(rows)} labelled sentences, {len(dialogues)} dialogues, {len(names)} acts;"
        f" fit on {len(train)} ({len(dialogues) - len(held)} dialogues), read on {len(test)} ({len(held)})"
    )
    # the annotated units are sentences already; the run splits simulator turns the same way
    assert all(len(sentences(text)) >= 1 for _, text, *_ in rows)

    embed = Embedder(args.embedder or ensure_base_model())
    started = time.monotonic()
    raw_train = np.asarray(embed([r[1] for r in train]), dtype=np.float64)
    raw_test = np.asarray(embed([r[1] for r in test]), dtype=np.float64)
    mean = raw_train.mean(0)  # centred on what it was fit on, as the run centres on its reference

    def unit(x):
        x = x - mean
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    y_train = np.array([names.index(r[2]) for r in train])
    y_test = np.array([names.index(r[2]) for r in test])
    w, b = fit_classifier(unit(raw_train), y_train, len(names))
    predicted = (unit(raw_test) @ w + b).argmax(1)
    print(f"embedding and fitting: {time.monotonic() - started:.0f} s")

    majority = Counter(y_train.tolist()).most_common(1)[0][0]
    accuracy = float((predicted == y_test).mean())
    baseline = float((y_test == majority).mean())

    def f1(c):
        tp = int(((predicted == c) & (y_test == c)).sum())
        p, t = int((predicted == c).sum()), int((y_test == c).sum())
        return 0.0 if tp == 0 else 2 * tp / (p + t)

    present = sorted(set(y_test.tolist()))
    macro = float(np.mean([f1(c) for c in present]))
    print(
        f"held-out accuracy {accuracy:.3f} (majority class '{names[majority]}': {baseline:.3f});"
        f" macro-F1 {macro:.3f} over the {len(present)} acts present"
    )
    print("act                              held-out  recall")
    for c in sorted(present, key=lambda c: -int((y_test == c).sum())):
        n = int((y_test == c).sum())
        print(f"{names[c][:32]:32} {n:8d}  {float((predicted[y_test == c] == c).mean()):.2f}")
    both = [(r[2], r[3]) for r in rows if r[3]]
    if both:
        agree = sum(a == b for a, b in both) / len(both)
        print(f"two annotators, {len(both)} sentences labelled twice: agreement {agree:.3f}")
    print(f"load {os.getloadavg()[0]:.1f} (1 min) at the end")


if __name__ == "__main__":
    main()
