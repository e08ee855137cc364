#!/usr/bin/env python3
"""Conformance fixtures for attnlab's Hugging Face loaders (issue 30): three tiny
random-initialised models, saved as `transformers` saves them, with the logits and attention
weights `transformers` computes for two fixed inputs.

Real GPT-2, Pythia and TinyStories weights cannot ship with the tests (hundreds of MB, and no
network in CI), so each family's quirks are caught on a model of a few hundred KB instead
(../shared/reference/mixers-mad-checkpoints.md §3.4):

- `gpt2/`: Conv1D weights stored (in, out), fused [q | k | v] with biases, tanh GELU
  (`gelu_new`), learned positions, tied head;
- `pythia/` (GPT-NeoX): per-head interleaved qkv, partial rotary (`rotary_pct` 0.25), parallel
  residual, exact GELU, untied head;
- `tinystories/` (GPT-Neo): separate q/k/v without bias, no 1/sqrt(d) score scaling,
  alternating global and local (window 8) layers, tied head;
- `gpt2-bin/`: `gpt2/`'s model saved as `pytorch_model.bin` (PyTorch's pickle).

Each folder holds `config.json` and `model.safetensors` (`save_pretrained`, safe
serialisation) and `reference.safetensors`: `input_ids` (2, 16) int64, `logits` (2, 16, V)
and `attentions` (layers, 2, heads, 16, 16) float32, from the eager attention path; for GPT-2
also `ablated_logits`, the logits with head 2 of layer 1 zero-ablated (`head_mask`). There is
one tokenizer, in `gpt2/`: GPT-2's byte-level BPE with its 256-byte alphabet and no merges
(`tokenizer.json`, as `tokenizers` saves it), and `tokenized.json`, a sentence and the ids and
tokens `tokenizers` gives it (the weights' 256 ids are random, so any text maps onto them).

Run by a developer, not in CI (it needs torch and transformers from PyPI):

    python -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers safetensors
    /tmp/hf/bin/python scripts/make_hf_fixtures.py tests/fixtures/hf

Made with transformers 4.57.1 and torch 2.15 on 2026-11-26; rerunning writes the same models
(seeded), though a later `transformers` may spell config keys differently, which the loaders
must read anyway.
"""

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoConfig,
    GPTNeoForCausalLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
)

VOCAB, POSITIONS, WIDTH, LAYERS, HEADS, LENGTH = 256, 64, 32, 2, 4, 16
# Weights of std 0.5, not the 0.02 of a fresh model: at 0.02 every pre-activation is so small
# that GELU's tanh and erf forms agree to 1e-7 and a loader with the wrong one would pass.
INIT = 0.5
# The head whose zero ablation GPT-2's `reference.safetensors` records as `ablated_logits`.
ABLATED = (1, 2)


def models():
    """(folder, model) for each family, each initialised from its own seed."""
    torch.manual_seed(1)
    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_positions=POSITIONS,
            n_embd=WIDTH,
            n_layer=LAYERS,
            n_head=HEADS,
            initializer_range=INIT,
            attn_implementation="eager",
        )
    )
    torch.manual_seed(2)
    pythia = GPTNeoXForCausalLM(
        GPTNeoXConfig(
            vocab_size=VOCAB,
            max_position_embeddings=POSITIONS,
            hidden_size=WIDTH,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            initializer_range=INIT,
            intermediate_size=4 * WIDTH,
            rotary_pct=0.25,
            use_parallel_residual=True,
            tie_word_embeddings=False,
            attn_implementation="eager",
        )
    )
    torch.manual_seed(3)
    tinystories = GPTNeoForCausalLM(
        GPTNeoConfig(
            vocab_size=VOCAB,
            max_position_embeddings=POSITIONS,
            hidden_size=WIDTH,
            num_layers=LAYERS,
            num_heads=HEADS,
            initializer_range=INIT,
            attention_types=[[["global", "local"], LAYERS // 2]],
            window_size=8,
            attn_implementation="eager",
        )
    )
    return [("gpt2", gpt2), ("pythia", pythia), ("tinystories", tinystories)]


def inputs():
    """Two fixed rows of 16 ids: a random one, and one that repeats its first 8 tokens (an
    induction pattern)."""
    generator = torch.Generator().manual_seed(4)
    first = torch.randint(0, VOCAB, (LENGTH,), generator=generator)
    half = torch.randint(0, VOCAB, (LENGTH // 2,), generator=generator)
    return torch.stack([first, torch.cat([half, half])])


TEXT = "The cat sat. The cat sat on the mat, naïvely!"


def tokenizer(folder):
    """GPT-2's byte-level BPE (ByteLevel pre-tokenizer and decoder, no prefix space) over its
    256-byte alphabet, without merges: 256 tokens, the fixture's vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator([TEXT], trainer)
    bpe.save(str(folder / "tokenizer.json"))
    encoding = bpe.encode(TEXT)
    tokenized = {"text": TEXT, "ids": encoding.ids, "tokens": encoding.tokens}
    (folder / "tokenized.json").write_text(json.dumps(tokenized, ensure_ascii=False) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for gpt2/, pythia/, tinystories/")
    out = parser.parse_args().out
    ids = inputs()
    for name, model in models():
        # Perturb the LayerNorms and biases, which start at 1 and 0: a loader that drops
        # one must not pass by luck.
        with torch.no_grad():
            for key, p in model.named_parameters():
                if p.dim() == 1:
                    p.add_(0.1 * torch.randn_like(p))
        model.eval()
        folder = out / name
        model.save_pretrained(folder, safe_serialization=True)
        if name == "gpt2":
            # The same weights as PyTorch's pickle, the format of older checkpoints.
            model.save_pretrained(out / "gpt2-bin", safe_serialization=False)
        with torch.no_grad():
            result = model(ids, output_attentions=True)
            reference = {
                "input_ids": ids.contiguous(),
                "logits": result.logits.float().contiguous(),
                "attentions": torch.stack(result.attentions).float().contiguous(),
            }
            if name == "gpt2":
                # Head ABLATED (layer, head) zero-ablated: `head_mask` multiplies its attention
                # weights by 0, so its output before the projection is 0 (TransformerLens's
                # zero ablation of hook_z). GPT-NeoX's head_mask gives NaN logits in
                # transformers 4.57.1's eager path, GPT-Neo's is another mechanism's: GPT-2's
                # alone is the reference.
                mask = torch.ones(LAYERS, HEADS)
                mask[ABLATED] = 0.0
                ablated = model(ids, head_mask=mask).logits
                reference["ablated_logits"] = ablated.float().contiguous()
        save_file(reference, folder / "reference.safetensors")
        config = json.loads((folder / "config.json").read_text())
        params = sum(p.numel() for p in model.parameters())
        print(f"{name}: {params} parameters, {config['architectures']}")
    tokenizer(out / "gpt2")


if __name__ == "__main__":
    main()
