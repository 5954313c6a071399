"""Golden values for tests/avg_case.h: torch.optim.swa_utils.AveragedModel on a sequence of weights.

A model of two tensors, weight (3, 4) and bias (3,). Its weights are set to a random walk of
10 values; after each one, AveragedModel.update_parameters(model). Four scenarios: EMA with
get_ema_multi_avg_fn(0.9), (0.999) and (0.3: torch's lerp takes its other branch), and the
default average (SWA). Output (text, one number
per token, %.9g):
    scenarios
    per scenario: kind (0 EMA, 1 SWA) decay updates nw nb
      per update: w (nw), b (nb) set in the model, then the averaged w (nw), b (nb) and n_averaged
Run (torch from PyPI): python3 tests/golden/make_avg_golden.py > tests/golden/avg_golden.txt
"""
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


class WB(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(3, 4).uniform_(-0.5, 0.5))
        self.bias = torch.nn.Parameter(torch.empty(3).uniform_(-0.5, 0.5))


torch.manual_seed(20261203)
scenarios = [(0, 0.9), (0, 0.999), (0, 0.3), (1, 0.0)]
out = [str(len(scenarios))]
for kind, decay in scenarios:
    model = WB()
    avg = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay)) if kind == 0 else AveragedModel(model)
    updates = 10
    out.append(f"{kind} {decay:.9g} {updates} 12 3")
    for s in range(updates):
        with torch.no_grad():
            model.weight.add_(torch.randn(3, 4) * 0.1 * (1 + s))
            model.bias.add_(torch.randn(3) * 0.05)
        avg.update_parameters(model)
        out.append(" ".join(f"{x:.9g}" for x in model.weight.detach().flatten().tolist()))
        out.append(" ".join(f"{x:.9g}" for x in model.bias.detach().flatten().tolist()))
        out.append(" ".join(f"{x:.9g}" for x in avg.module.weight.detach().flatten().tolist()))
        out.append(" ".join(f"{x:.9g}" for x in avg.module.bias.detach().flatten().tolist()))
        out.append(str(int(avg.n_averaged.item())))
print("\n".join(out))
