#!/usr/bin/env python3
"""Reads attnlab's TensorBoard event files back with TensorBoard's own reader.

    python3 -m venv /tmp/tb && /tmp/tb/bin/pip install tensorboard
    /tmp/tb/bin/python scripts/check_tensorboard.py runs/<run>/tensorboard
    /tmp/tb/bin/python scripts/check_tensorboard.py --golden tests/fixtures/tensorboard

For a run folder it checks what `src/train/board.rs` writes: the step and evaluation scalars,
an attention map per layer and head that decodes as a PNG of the size it claims, and the
HParams plugin's session start (the resolved preset) and end. With
`--golden` it checks the file the Rust test `events_are_the_bytes_tensorboard_read_back` pins:
its values, and that a restart drops the events trained again. Exits non-zero on the first
thing that does not hold, saying what.
"""

import argparse
import io
import os
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2


def load(folder):
    acc = event_accumulator.EventAccumulator(
        folder, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0,
                               event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def hparams(acc):
    """The HParams plugin's three messages, by tag, parsed from their plugin data."""
    found = {}
    for tag, content in acc.PluginTagToContent("hparams").items():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        found[tag] = data
    return found


def require(condition, what):
    if not condition:
        sys.exit(f"check_tensorboard: {what}")


def check_hparams(acc, expect):
    """The session's start (the settings) and end; no experiment summary, so that TensorBoard
    builds the experiment from every run of a log folder (src/tensorboard/mod.rs says why)."""
    data = hparams(acc)
    require(sorted(data) == ["_hparams_/session_end_info", "_hparams_/session_start_info"],
            f"hparams tags {sorted(data)}")
    start = data["_hparams_/session_start_info"].session_start_info
    end = data["_hparams_/session_end_info"].session_end_info
    require(len(start.hparams) > 0, "the session has no settings")
    for name, value in expect.items():
        got = start.hparams[name]
        got = got.WhichOneof("kind") and getattr(got, got.WhichOneof("kind"))
        require(got == value, f"hparam {name} = {got!r}, expected {value!r}")
    require(end.status == 1, f"session end status {end.status}, expected 1 (success)")
    print(f"hparams: {len(start.hparams)} settings, session ended with status {end.status}")


def check_golden(folder):
    acc = load(folder)
    tags = acc.Tags()
    loss = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    accuracy = [(e.step, e.value) for e in acc.Scalars("test/accuracy")]
    require(loss == [(1, 2.5)], f"train/loss {loss}")
    require(accuracy == [(2, 0.75)], f"test/accuracy {accuracy}: the restart should drop 0.5")
    images = acc.Images("attention/L0H0")
    require(len(images) == 1 and (images[0].width, images[0].height) == (1, 1),
            f"attention/L0H0 {images}")
    check_hparams(acc, {"attention.kind": "softmax", "model.d_model": 128.0,
                        "train.tensorboard": True})
    print(f"golden file read back: scalars {tags['scalars']}, images {tags['images']}")


def check_run(folder):
    from PIL import Image

    acc = load(folder)
    tags = acc.Tags()
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s",
                "test/accuracy", "test/loss"):
        require(tag in tags["scalars"], f"no scalar {tag} (scalars: {tags['scalars']})")
    steps = [e.step for e in acc.Scalars("train/loss")]
    require(steps == sorted(steps) and len(steps) == len(set(steps)),
            f"train/loss steps not one per step: {steps[:10]}…")
    maps = [t for t in tags["images"] if t.startswith("attention/L")]
    require(maps, f"no attention maps (images: {tags['images']})")
    for tag in maps:
        for event in acc.Images(tag):
            image = Image.open(io.BytesIO(event.encoded_image_string))
            require(image.size == (event.width, event.height),
                    f"{tag} at step {event.step}: PNG {image.size}, event "
                    f"{(event.width, event.height)}")
        entropy = f"attention/entropy/{tag.split('/')[1]}"
        require(entropy in tags["scalars"], f"no {entropy}")
    check_hparams(acc, {})
    print(f"run read back: {len(steps)} steps, scalars {sorted(tags['scalars'])}, "
          f"{len(maps)} attention maps × {len(acc.Images(maps[0]))} evaluations")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a run's tensorboard/ folder (or the golden one)")
    parser.add_argument("--golden", action="store_true",
                        help="check the golden file of tests/fixtures/tensorboard")
    args = parser.parse_args()
    # TensorBoard's reader answers a missing folder with a traceback ("permanently deleted").
    if not os.path.isdir(args.folder):
        sys.exit(f"check_tensorboard: {args.folder} is not a folder")
    (check_golden if args.golden else check_run)(args.folder)


if __name__ == "__main__":
    main()
