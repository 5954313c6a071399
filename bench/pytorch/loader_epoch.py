#!/usr/bin/env python3
"""Data path only, PyTorch peer (bench/pytorch/multitf.py's loaders): the window layout read once
and kept resident (ResidentLoader) against the series layout (SeriesLoader: bars resident,
windows cut by indexing), one epoch of batches each, no model; the layouts alternate rep by rep.
Also checks that both give the same batches (bitwise, first and last batch).

  python3 bench/pytorch/loader_epoch.py --window W.h5 --series S.h5 [--batch 32 --reps 3 --device cpu|cuda]
"""
import argparse
import time

import torch

from multitf import ResidentLoader, SeriesLoader


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--window", required=True)
    p.add_argument("--series", required=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = p.parse_args()
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    kinds = [("window", ResidentLoader, a.window), ("series", SeriesLoader, a.series)]
    ends = {}
    for rep in range(a.reps):
        for name, cls, path in (kinds if rep % 2 == 0 else kinds[::-1]):
            t0 = time.perf_counter()
            ld = cls(path, a.batch, dev)
            sync()
            t1 = time.perf_counter()
            n, first, last = 0, None, None
            for x, y in ld:
                x = x.contiguous()  # a view for the window layout; the series' cat is already one
                first = x if first is None else first
                last = x
                n += x.shape[0]
            sync()
            t2 = time.perf_counter()
            ends[name] = (first, last)
            print(f"{name:6s} open {t1 - t0:.3f} s  epoch {t2 - t1:.3f} s  {n / (t2 - t1):.0f} samples/s", flush=True)
            del ld
    same = all(torch.equal(ends["window"][i], ends["series"][i]) for i in range(2))
    print(f"first and last batches bitwise equal: {same}")


if __name__ == "__main__":
    main()
