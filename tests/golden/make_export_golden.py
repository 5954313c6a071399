#!/usr/bin/env python3
"""Make the PyTorch-written golden files read by tests/test_export.c (no Python in CI):

  tests/golden/multitf_torch.safetensors     bench/pytorch/multitf.py's MultiTF (F=3, K=2,
      segments 6,4,3,2,1, hidden 4, head 5), seeded init, saved with
      safetensors.torch.save_file(model.state_dict(), metadata=...) as a user would
  tests/golden/multitf_torch_io.safetensors  x (N=4, T=16, F=3) random inputs and
      pred (N, K) = model(x) in fp32 on the CPU

Run once from the repository root:  python3 tests/golden/make_export_golden.py
"""
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, "bench/pytorch")
from multitf import MultiTF  # noqa: E402

F, K, SEG, H, HEAD, N = 3, 2, [6, 4, 3, 2, 1], 4, 5, 4


def main():
    torch.manual_seed(20261124)
    model = MultiTF(F, K, SEG, H, HEAD).eval()
    x = torch.randn(N, sum(SEG), F)
    with torch.no_grad():
        pred = model(x)
    meta = {"format": "megabatch.multitf/1", "segments": ",".join(map(str, SEG)), "features": str(F),
            "targets": str(K), "hidden": str(H), "head": str(HEAD), "layers": "1", "carry": "0",
            "made_by": f"tests/golden/make_export_golden.py, torch {torch.__version__}"}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, "tests/golden/multitf_torch.safetensors",
              metadata=meta)
    save_file({"x": x, "pred": pred}, "tests/golden/multitf_torch_io.safetensors")


if __name__ == "__main__":
    main()
