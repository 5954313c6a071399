#!/usr/bin/env python3
"""PyTorch peer of examples/train_multitf.c: the same multi-timeframe model on the same HDF5 files.

Model: one nn.LSTM (batch_first) per segment of `features` [N, T, F] (segment lengths from the
`segments` attribute, e.g. 480,288,192,96,48 for T=1104), last hidden states concatenated
(B, S*H) -> Linear(S*H, head) -> GELU(tanh) -> Linear(head, K); MSE; AdamW (betas 0.9/0.999,
eps 1e-8, weight decay --weight-decay), grad-norm clip --clip, warmup + cosine to 0 over the
run's optimizer steps (same formula as mb_lr_at); train batches in file order (the C example
does not shuffle either); validation loss and the zero-prediction baseline after each epoch.

Pipelines (--pipeline):
  seeds  the seeds' ChunkDataLoader as written (shared/seeds/000_*.txt): each epoch re-reads
         the file with h5py chunk by chunk (--chunk-gb, default 12), moves each chunk to the
         device (pinned when CUDA), slices batches there; on CUDA autocast() + GradScaler
         (unscale, clip_grad_norm_, scaler.step) as in the seeds; on CPU plain fp32.
         The seeds' loader reads an undefined `self.target_length`; here it is targets.shape[1].
  tuned  data read once and kept on the device; fused AdamW on CUDA (foreach on CPU);
         a series-layout file (docs/SERIES.md) keeps its bars on the device and cuts each
         batch's windows there by indexing (SeriesLoader), as megabatch's series mode;
         fp16 autocast + GradScaler on CUDA (so cuDNN may pick its persistent LSTM kernel);
         plain fp32 on CPU.

samples/s counts training samples over training time only (evaluation excluded), as the C
example does. Last line:
  summary: epochs=.. steps=.. train_loss=.. val_loss=.. baseline_val_loss=.. samples_per_s=..

  python3 bench/pytorch/multitf.py --train data/train.h5 --val data/val.h5 --pipeline tuned \
      [--epochs 3 --batch 128 --hidden 32 --head 64 --lr 2e-3 --warmup 20 --clip 1.0
       --weight-decay 0.01 --threads 0 --max-batches 0 --seed 1 --device cpu|cuda --quiet --no-ftz]
CPU: flush-to-zero + denormals-are-zero on by default (torch.set_flush_denormal, as megabatch's
CPU backend does by default); --no-ftz keeps IEEE denormals.
"""
import argparse
import math
import sys
import time

import h5py
import numpy as np
import torch
import torch.nn as nn


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True)
    p.add_argument("--val", required=True)
    p.add_argument("--pipeline", choices=["seeds", "tuned"], default="tuned")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--head", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch default)")
    p.add_argument("--no-ftz", action="store_true",
                   help="CPU: keep IEEE denormals (default: flush-to-zero + denormals-are-zero, as megabatch)")
    p.add_argument("--max-batches", type=int, default=0, help="train batches per epoch (0: all)")
    p.add_argument("--chunk-gb", type=float, default=12.0, help="seeds pipeline: chunk size in GiB")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args()


# ---- data ----

def is_series(path):
    """The series layout (docs/SERIES.md): bars_s + ends instead of features."""
    with h5py.File(path, "r") as f:
        return "features" not in f and "ends" in f


def read_meta(path):
    with h5py.File(path, "r") as f:
        if "features" not in f and "ends" in f:  # series layout: T is the sum of the windows
            seg = [int(s) for s in f["ends"].attrs["segments"]]
            n, t, nf = f["ends"].shape[0], sum(seg), f["bars_0"].shape[1]
        else:
            n, t, nf = f["features"].shape
            seg = f["features"].attrs.get("segments")
            seg = [int(s) for s in seg] if seg is not None else [t]
        k = f["targets"].shape[1]
    if sum(seg) != t:
        sys.exit(f"error: {path}: segments {seg} do not sum to T={t}")
    return n, t, nf, k, seg


class ChunkDataLoader:
    """The seeds' loader as written: chunks read from HDF5 and moved to the device each epoch."""

    def __init__(self, hdf5_path, batch_size=128, chunk_size_gb=12.0, device="cuda"):
        self.hdf5_path, self.batch_size, self.device = hdf5_path, batch_size, torch.device(device)
        with h5py.File(hdf5_path, "r") as f:
            self.num_samples, self.sequence_length, self.feature_count = f["features"].shape
            self.target_length = f["targets"].shape[1]
        bytes_per_sample = self.sequence_length * self.feature_count * 4 + self.target_length * 4
        per_chunk = int(chunk_size_gb * 1024**3 / bytes_per_sample)
        per_chunk = max(batch_size, min(per_chunk, self.num_samples))
        self.chunk_ranges = [(s, min(s + per_chunk, self.num_samples)) for s in range(0, self.num_samples, per_chunk)]

    def _load_chunk(self, start, end):
        with h5py.File(self.hdf5_path, "r") as f:
            features = f["features"][start:end]
            targets = f["targets"][start:end]
        x, y = torch.from_numpy(features), torch.from_numpy(targets)
        if self.device.type == "cuda":  # pinned staging only exists with CUDA
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def __iter__(self):
        for start, end in self.chunk_ranges:
            cx, cy = self._load_chunk(start, end)
            for i in range(0, end - start, self.batch_size):
                yield cx[i:i + self.batch_size], cy[i:i + self.batch_size]
            del cx, cy
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def batches(self):
        return (self.num_samples + self.batch_size - 1) // self.batch_size


class ResidentLoader:
    """Tuned: the whole file read once, kept on the device, batches are views."""

    def __init__(self, hdf5_path, batch_size, device):
        with h5py.File(hdf5_path, "r") as f:
            self.x = torch.from_numpy(np.asarray(f["features"][...], dtype=np.float32)).to(device)
            self.y = torch.from_numpy(np.asarray(f["targets"][...], dtype=np.float32)).to(device)
        self.batch_size = batch_size

    def __iter__(self):
        for i in range(0, self.x.shape[0], self.batch_size):
            yield self.x[i:i + self.batch_size], self.y[i:i + self.batch_size]

    def batches(self):
        return (self.x.shape[0] + self.batch_size - 1) // self.batch_size


class SeriesLoader:
    """Series layout (docs/SERIES.md), as megabatch's series mode: every timeframe's bars, the
    per-sample bar indices and the targets resident on the device; each batch's windows cut
    there by indexing (rows ends[b, s] - L_s + 1 .. ends[b, s] of bars_s), concatenated."""

    def __init__(self, hdf5_path, batch_size, device):
        with h5py.File(hdf5_path, "r") as f:
            lens = [int(s) for s in f["ends"].attrs["segments"]]
            self.bars = [torch.from_numpy(np.asarray(f[f"bars_{s}"][...], dtype=np.float32)).to(device)
                         for s in range(len(lens))]
            self.ends = torch.from_numpy(np.asarray(f["ends"][...], dtype=np.int64)).to(device)
            self.y = torch.from_numpy(np.asarray(f["targets"][...], dtype=np.float32)).to(device)
        self.offs = [torch.arange(1 - L, 1, device=device) for L in lens]
        self.batch_size = batch_size

    def __iter__(self):
        for i in range(0, self.ends.shape[0], self.batch_size):
            e = self.ends[i:i + self.batch_size]
            x = torch.cat([b[e[:, s, None] + o] for s, (b, o) in enumerate(zip(self.bars, self.offs))], dim=1)
            yield x, self.y[i:i + self.batch_size]

    def batches(self):
        return (self.ends.shape[0] + self.batch_size - 1) // self.batch_size


# ---- model ----

class MultiTF(nn.Module):
    def __init__(self, f, k, seg, hidden, head):
        super().__init__()
        self.seg = seg
        self.enc = nn.ModuleList([nn.LSTM(f, hidden, batch_first=True) for _ in seg])
        self.fc1 = nn.Linear(len(seg) * hidden, head)
        self.fc2 = nn.Linear(head, k)

    def forward(self, x):  # x (B, T, F)
        hs, off = [], 0
        for enc, n in zip(self.enc, self.seg):
            _, (h, _) = enc(x[:, off:off + n])  # h (1, B, H)
            hs.append(h[-1])
            off += n
        z = torch.cat(hs, dim=1)  # (B, S*H)
        return self.fc2(nn.functional.gelu(self.fc1(z), approximate="tanh"))  # (B, K)


def lr_at(step, base, warmup, total):
    """mb_lr_at, MB_LR_WARMUP_COSINE with min_lr 0."""
    if step < warmup:
        return base * (step + 1) / warmup
    return base / 2.0 * (math.cos(math.pi * (step - warmup) / (total - warmup)) + 1.0)


# ---- run ----

def evaluate(model, loader, amp):
    model.eval()
    s = b = 0.0
    n = 0
    with torch.no_grad():
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                pred = model(x)
            s += nn.functional.mse_loss(pred.float(), y).item() * x.shape[0]
            b += y.pow(2).mean().item() * x.shape[0]
            n += x.shape[0]
    model.train()
    return s / max(n, 1), b / max(n, 1)


def main():
    a = parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda but torch.cuda.is_available() is False")
    # before torch starts its intra-op threads: they take the setting of the thread creating them
    if a.device == "cpu" and not torch.set_flush_denormal(not a.no_ftz) and not a.no_ftz:
        sys.exit("error: torch.set_flush_denormal is not supported on this CPU")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = a.pipeline == "tuned"

    n, t, f, k, seg = read_meta(a.train)
    nv, tv, fv, kv, _ = read_meta(a.val)
    if (t, f, k) != (tv, fv, kv):
        sys.exit(f"error: {a.train} and {a.val} differ in shape (T, F, K)")
    if is_series(a.train) or is_series(a.val):
        if a.pipeline == "seeds" or not (is_series(a.train) and is_series(a.val)):
            sys.exit("error: series-layout files take --pipeline tuned, for both --train and --val")
        tr = SeriesLoader(a.train, a.batch, dev)
        va = SeriesLoader(a.val, a.batch, dev)
    elif a.pipeline == "seeds":
        tr = ChunkDataLoader(a.train, a.batch, a.chunk_gb, a.device)
        va = ChunkDataLoader(a.val, a.batch, a.chunk_gb, a.device)
    else:
        tr = ResidentLoader(a.train, a.batch, dev)
        va = ResidentLoader(a.val, a.batch, dev)

    model = MultiTF(f, k, seg, a.hidden, a.head).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    opt_kw = dict(lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay)
    if a.pipeline == "tuned":
        opt_kw["fused" if cuda else "foreach"] = True
    opt = torch.optim.AdamW(model.parameters(), **opt_kw)
    amp = cuda  # seeds: autocast + GradScaler on CUDA; tuned: fp16 autocast on CUDA; CPU: fp32
    scaler = torch.amp.GradScaler("cuda", enabled=amp)

    nb = tr.batches()
    if a.max_batches and a.max_batches < nb:
        nb = a.max_batches
    total = max(2, a.epochs * nb)
    warmup = a.warmup if a.warmup < total else total // 2

    print(f"device: {a.device} ({torch.cuda.get_device_name() if cuda else 'cpu'}) torch {torch.__version__} "
          f"threads={torch.get_num_threads()} ftz={'off' if a.no_ftz else 'on'} pipeline={a.pipeline} "
          f"amp={'fp16' if amp else 'off'} cpu_isa={torch.backends.cpu.get_cpu_capability()}")
    print(f"data: {a.train} N={n} T={t} F={f} K={k}, {len(seg)} segments {seg}; params: {nparams} floats")
    step = samples = 0
    seconds = 0.0
    train_loss = val_loss = base = 0.0
    for epoch in range(1, a.epochs + 1):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        lsum = torch.zeros((), device=dev)
        en = eb = 0
        for x, y in tr:
            if a.max_batches and eb >= a.max_batches:
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(step, a.lr, warmup, total)
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                pred = model(x)
            loss = nn.functional.mse_loss(pred.float(), y)  # loss in fp32, as the seeds advise
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=a.clip)
            scaler.step(opt)
            scaler.update()
            step += 1
            lsum += loss.detach() * x.shape[0]
            en += x.shape[0]
            eb += 1
            if not a.quiet and (eb % 10 == 0):
                print(f"\repoch {epoch} batch {eb} loss {loss.item():.4f}  "
                      f"{en / (time.perf_counter() - t0):.0f} samples/s   ", end="", file=sys.stderr, flush=True)
        train_loss = lsum.item() / max(en, 1)  # syncs the device
        seconds += time.perf_counter() - t0
        samples += en
        if not a.quiet:
            print(file=sys.stderr)
        val_loss, base = evaluate(model, va, amp)
        mem = f"  peak device memory {torch.cuda.max_memory_allocated() / 1e6:.1f} MB" if cuda else ""
        print(f"epoch {epoch}: steps {step} train_loss {train_loss:.5f} val_loss {val_loss:.5f} baseline {base:.5f}  "
              f"{samples / seconds:.0f} samples/s{mem}", flush=True)
    print(f"summary: epochs={a.epochs} steps={step} train_loss={train_loss:.5f} val_loss={val_loss:.5f} "
          f"baseline_val_loss={base:.5f} samples_per_s={samples / seconds if seconds > 0 else 0.0:.1f} "
          f"threads={torch.get_num_threads()} ftz={'off' if a.no_ftz or cuda else 'on'} "
          f"cpu_isa={torch.backends.cpu.get_cpu_capability()}")


if __name__ == "__main__":
    main()
