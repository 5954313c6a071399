#!/usr/bin/env python3
"""PyTorch peer of bench/bench_lstm.c: one nn.LSTM layer, forward+backward time per step.
Usage: python3 bench/pytorch/lstm.py [B T F H [iters]] [--device cpu|cuda] [--amp] [--threads N]
       [--no-ftz]
(default 128 480 128 256 1, cpu). --amp: fp16 autocast (on a GPU cuDNN then uses its
persistent kernel where it can). Loss: the mean of h_last; timings end with a sync.
CPU: flush-to-zero + denormals-are-zero on (torch.set_flush_denormal, set before torch
starts its intra-op threads, which take the setting of the thread that creates them), as
megabatch does by default; --no-ftz leaves IEEE denormals, like bench_lstm --no-ftz."""
import argparse, time
import torch

ap = argparse.ArgumentParser()
ap.add_argument("shape", nargs="*", type=int)
ap.add_argument("--device", default="cpu")
ap.add_argument("--amp", action="store_true")
ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
ap.add_argument("--no-ftz", action="store_true", help="keep IEEE denormals (default: flush)")
a = ap.parse_args()
ftz = not a.no_ftz
if a.device == "cpu" and not torch.set_flush_denormal(ftz) and ftz:
    raise SystemExit("torch.set_flush_denormal is not supported on this CPU")
if a.threads:
    torch.set_num_threads(a.threads)
B, T, F, H = a.shape[:4] if len(a.shape) >= 4 else (128, 480, 128, 256)
iters = a.shape[4] if len(a.shape) > 4 else 1
dev = torch.device(a.device)
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
torch.manual_seed(1)
m = torch.nn.LSTM(F, H, batch_first=True).to(dev)
x = (torch.rand(B, T, F) - 0.5).to(dev)
tf = tb = 0.0
peak = 0
for it in range(iters + 1):  # iteration 0 warms up
    sync()
    t0 = time.perf_counter()
    with torch.autocast(device_type=dev.type, dtype=torch.float16, enabled=a.amp):
        out, (hn, cn) = m(x)
        loss = hn[-1].float().mean()
    sync()
    t1 = time.perf_counter()
    loss.backward()
    sync()
    t2 = time.perf_counter()
    if it:
        tf += t1 - t0
        tb += t2 - t1
if dev.type == "cuda":
    peak = torch.cuda.max_memory_allocated() / 2**20
name = torch.cuda.get_device_name() if dev.type == "cuda" else \
    f"cpu threads={torch.get_num_threads()} ftz={'on' if ftz else 'off'}"
print(f"torch {torch.__version__} {name} {'fp16-autocast' if a.amp else 'f32'} B={B} T={T} F={F} H={H} "
      f"fwd {1e6 * tf / iters / T:8.1f} us/step  fwd+bwd {1e6 * (tf + tb) / iters / T:8.1f} us/step"
      + (f"  peak {peak:.1f} MiB" if peak else ""))
