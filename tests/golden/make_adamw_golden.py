"""Golden values for tests/test_numerics.c: torch.optim.AdamW (+ clip_grad_norm_).

Two tensors, weight (3, 4) with weight decay 0.1 and bias (3,) without (the library's
default for rank-1 tensors), 6 steps with per-step learning rates and gradients, in two
scenarios: no clipping, and clip_grad_norm_(max_norm=0.5). Output (text, one number per
token, %.9g):
    scenarios
    per scenario: max_norm steps nw nb, w0 (nw), b0 (nb),
      per step: lr, gw (nw), gb (nb), norm (pre-clip total norm), w (nw), b (nb) after the step
Run: python3 tests/golden/make_adamw_golden.py > tests/golden/adamw_golden.txt
"""
import torch

torch.manual_seed(20240601)
out = []
scenarios = [0.0, 0.5]
out.append(str(len(scenarios)))
for max_norm in scenarios:
    w = torch.nn.Parameter(torch.empty(3, 4).uniform_(-0.5, 0.5))
    b = torch.nn.Parameter(torch.empty(3).uniform_(-0.5, 0.5))
    opt = torch.optim.AdamW([{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    steps = 6
    out.append(f"{max_norm:.9g} {steps} {w.numel()} {b.numel()}")
    out.append(" ".join(f"{x:.9g}" for x in w.detach().flatten().tolist()))
    out.append(" ".join(f"{x:.9g}" for x in b.detach().flatten().tolist()))
    for s in range(steps):
        lr = [1e-2, 5e-2, 2e-2, 1e-1, 3e-2, 1e-2][s]
        for g in opt.param_groups:
            g["lr"] = lr
        gw = torch.randn(3, 4) * (1.0 + s)
        gb = torch.randn(3) * 0.5
        w.grad = gw.clone()
        b.grad = gb.clone()
        norm = torch.linalg.vector_norm(torch.cat([gw.flatten(), gb.flatten()])).item()
        if max_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_([w, b], max_norm).item()
        opt.step()
        out.append(f"{lr:.9g}")
        out.append(" ".join(f"{x:.9g}" for x in gw.flatten().tolist()))
        out.append(" ".join(f"{x:.9g}" for x in gb.flatten().tolist()))
        out.append(f"{norm:.9g}")
        out.append(" ".join(f"{x:.9g}" for x in w.detach().flatten().tolist()))
        out.append(" ".join(f"{x:.9g}" for x in b.detach().flatten().tolist()))
print("\n".join(out))
