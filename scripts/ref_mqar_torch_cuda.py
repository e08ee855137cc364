#!/usr/bin/env python3
"""Runs the PyTorch MQAR reference (../shared/bench/ref_mqar_torch.py) on the GPU, unchanged:
every tensor and module it creates lands on CUDA through torch.set_default_device, and its
per-step loss.item() synchronises, so its timings are GPU timings. Same arguments as the
reference, which is $REF_MQAR_TORCH, else ref_mqar_torch.py beside this script (build-cuda.sh
copies it into dist/), else ../shared/bench/ref_mqar_torch.py from the repository.

    attnlab bench --set train.device=cuda:0 --torch scripts/ref_mqar_torch_cuda.py
"""
import os, runpy, sys
import torch

here = os.path.dirname(os.path.abspath(__file__))
candidates = [
    os.environ.get("REF_MQAR_TORCH"),
    os.path.join(here, "ref_mqar_torch.py"),
    os.path.join(here, "..", "..", "shared", "bench", "ref_mqar_torch.py"),
]
ref = next((c for c in candidates if c and os.path.isfile(c)), None)
if ref is None:
    sys.exit("ref_mqar_torch_cuda.py: reference script not found; set REF_MQAR_TORCH")
if not torch.cuda.is_available():
    sys.exit("ref_mqar_torch_cuda.py: PyTorch sees no CUDA GPU")
torch.set_default_device(os.environ.get("TORCH_DEVICE", "cuda"))
sys.argv[0] = ref
runpy.run_path(ref, run_name="__main__")
