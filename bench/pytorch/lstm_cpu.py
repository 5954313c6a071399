#!/usr/bin/env python3
"""PyTorch CPU peer of bench/bench_lstm.c: nn.LSTM forward+backward time per step.
Usage: python3 bench/pytorch/lstm_cpu.py [B T F H [iters]]  (default 128 480 128 256 1)"""
import sys, time
import torch

a = [int(v) for v in sys.argv[1:]]
B, T, F, H = a[:4] if len(a) >= 4 else (128, 480, 128, 256)
iters = a[4] if len(a) > 4 else 1
torch.manual_seed(1)
m = torch.nn.LSTM(F, H, batch_first=True)
x = torch.rand(B, T, F) - 0.5
tf = tb = 0.0
for it in range(iters + 1):  # iteration 0 warms up
    t0 = time.perf_counter()
    out, (hn, cn) = m(x)
    t1 = time.perf_counter()
    hn[-1].mean().backward()
    t2 = time.perf_counter()
    if it:
        tf += t1 - t0
        tb += t2 - t1
print(f"torch {torch.__version__} threads={torch.get_num_threads()} B={B} T={T} F={F} H={H} "
      f"fwd {1e6 * tf / iters / T:8.1f} us/step  fwd+bwd {1e6 * (tf + tb) / iters / T:8.1f} us/step")
