#!/usr/bin/env python3
"""The weights file between megabatch and PyTorch (docs/TRADING.md). Optional: the C tests
do not need it (tests/test_export.c reads a committed golden file); tests/test_predict.c
runs tests/export_roundtrip.sh, which calls this, when torch, safetensors and h5py import.

  check: torch loads a file strictly into multitf.py's MultiTF and predicts the samples of
         an HDF5 file; the C predictions (build/predict's CSV) must agree within --tol.
    python3 bench/pytorch/export_roundtrip.py check --model M.safetensors --data val.h5 --preds p.csv
  make:  torch trains MultiTF for a few steps on an HDF5 file and saves it with
         safetensors.torch.save_file (metadata as train_multitf --export writes it).
    python3 bench/pytorch/export_roundtrip.py make --out M.safetensors --data train.h5 [--hidden 8 --head 16]
"""
import argparse
import sys

import h5py
import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from multitf import MultiTF, read_meta  # noqa: E402


def check(a):
    sd = load_file(a.model)
    _, t, f, k, seg = read_meta(a.data)
    hidden, head = sd["enc.0.weight_hh_l0"].shape[1], sd["fc1.weight"].shape[0]
    model = MultiTF(f, k, seg, hidden, head)
    model.load_state_dict(sd, strict=True)  # raises on any missing, extra or misshapen tensor
    model.eval()
    with h5py.File(a.data, "r") as h:
        x = torch.from_numpy(np.asarray(h["features"][...], dtype=np.float32))
    with torch.no_grad():
        want = torch.cat([model(x[i:i + 256]) for i in range(0, x.shape[0], 256)]).numpy()
    got = np.loadtxt(a.preds, delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    if got.shape != want.shape:
        sys.exit(f"error: {a.preds} holds {got.shape}, torch predicts {want.shape}")
    err = float(np.max(np.abs(got - want)))
    print(f"torch strict load ok: {len(sd)} tensors; {want.size} predictions, max |C - torch| = {err:.3g}")
    if not err <= a.tol:
        sys.exit(f"error: predictions differ by {err:.3g} > {a.tol}")


def make(a):
    torch.manual_seed(a.seed)
    _, t, f, k, seg = read_meta(a.data)
    model = MultiTF(f, k, seg, a.hidden, a.head)
    with h5py.File(a.data, "r") as h:
        x = torch.from_numpy(np.asarray(h["features"][: 32 * a.steps], dtype=np.float32))
        y = torch.from_numpy(np.asarray(h["targets"][: 32 * a.steps], dtype=np.float32))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for i in range(0, x.shape[0], 32):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[i:i + 32]), y[i:i + 32])
        loss.backward()
        opt.step()
    meta = {"format": "megabatch.multitf/1", "segments": ",".join(map(str, seg)), "features": str(f),
            "targets": str(k), "hidden": str(a.hidden), "head": str(a.head), "layers": "1", "carry": "0"}
    save_file({n: p.detach().contiguous() for n, p in model.state_dict().items()}, a.out, metadata=meta)
    print(f"torch trained {x.shape[0] // 32} steps (last loss {loss.item():.4f}) -> {a.out}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--model", required=True)
    c.add_argument("--data", required=True)
    c.add_argument("--preds", required=True)
    c.add_argument("--tol", type=float, default=1e-5)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--data", required=True)
    m.add_argument("--hidden", type=int, default=8)
    m.add_argument("--head", type=int, default=16)
    m.add_argument("--steps", type=int, default=10)
    m.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(1)
    check(a) if a.cmd == "check" else make(a)


if __name__ == "__main__":
    main()
