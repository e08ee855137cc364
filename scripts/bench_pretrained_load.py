"""Issue 30's loading benchmark, with no download: a random-weight GPT-2 small (124 M) or
Pythia-160m built offline from its `transformers` config class and saved as a Hugging Face
folder, then `transformers`' load of that folder timed (the median of several), so that
`attnlab attend` / `attnlab heads` on the same folder can be timed beside it on the same machine.

    python scripts/bench_pretrained_load.py gpt2 /tmp/gpt2-small
    python scripts/bench_pretrained_load.py pythia /tmp/pythia-160m

Needs `pip install torch transformers` (run by hand, not by CI). The folder gets the GPT-2 test
fixture's byte-level tokenizer.json (256 ids, within both vocabularies), so attnlab can read a
text through it; a text of N ASCII bytes is N tokens.
"""

import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM

FAMILIES = {
    # GPT-2 small: transformers' defaults are its shape (12 layers, d 768, 12 heads, 1,024 positions).
    "gpt2": (GPT2Config, GPT2LMHeadModel, {}),
    # Pythia-160m's config.json.
    "pythia": (
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        dict(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=2048,
            rotary_pct=0.25,
            rotary_emb_base=10000,
            vocab_size=50304,
            use_parallel_residual=True,
            tie_word_embeddings=False,
            bos_token_id=0,
            eos_token_id=0,
        ),
    ),
}


def main() -> None:
    family, folder = sys.argv[1], Path(sys.argv[2])
    config_class, model_class, settings = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(**settings))
    model.save_pretrained(folder, safe_serialization=True)
    fixture = Path(__file__).resolve().parent.parent / "tests/fixtures/hf/gpt2/tokenizer.json"
    shutil.copy(fixture, folder / "tokenizer.json")
    params = sum(p.numel() for p in model.parameters())
    del model
    times = []
    for _ in range(5):
        start = time.perf_counter()
        model_class.from_pretrained(folder)
        times.append(time.perf_counter() - start)
    print(
        f"{family}: {params / 1e6:.1f} M parameters in {folder}; transformers "
        f"{model_class.__name__}.from_pretrained: median {statistics.median(times):.2f} s "
        f"(of {', '.join(f'{t:.2f}' for t in times)})"
    )


if __name__ == "__main__":
    main()
