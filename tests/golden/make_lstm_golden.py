#!/usr/bin/env python3
"""Make tests/golden/lstm_golden.txt: torch.nn.LSTM (fp32, CPU) outputs, final states and
gradients for a few small random cases, read by tests/test_lstm.c (test_golden_torch).

Run once from the repository root:  python3 tests/golden/make_lstm_golden.py
Format (text): per case a line `case B T F H L with_state`, then arrays, each as a line
`NAME COUNT` followed by COUNT values (%.9g, row-major):
  x (B,T,F), h0 c0 (L,B,H) when with_state, r1 (B,T,H), r2 (B,H),
  then per layer k: weight_ih_l{k} weight_hh_l{k} bias_ih_l{k} bias_hh_l{k},
  out (B,T,H), h_n c_n (L,B,H), then grad of loss = sum(out*r1) + sum(h_n[-1]*r2) for
  every parameter (named grad.<param>), dx, and dh0 dc0 when with_state."""
import torch

CASES = [(2, 5, 3, 4, 2, True), (3, 7, 2, 3, 1, False), (1, 4, 5, 6, 3, True)]


def emit(f, name, t):
    v = t.detach().reshape(-1).tolist()
    f.write(f"{name} {len(v)}\n" + " ".join(f"{x:.9g}" for x in v) + "\n")


def main():
    torch.manual_seed(20240514)
    with open("tests/golden/lstm_golden.txt", "w") as f:
        f.write(f"# made by tests/golden/make_lstm_golden.py with torch {torch.__version__}\n")
        for B, T, F, H, L, st in CASES:
            f.write(f"case {B} {T} {F} {H} {L} {int(st)}\n")
            m = torch.nn.LSTM(F, H, num_layers=L, batch_first=True)
            x = torch.randn(B, T, F, requires_grad=True)
            h0 = (0.5 * torch.randn(L, B, H)).requires_grad_(True)
            c0 = (0.5 * torch.randn(L, B, H)).requires_grad_(True)
            r1, r2 = torch.randn(B, T, H), torch.randn(B, H)
            out, (hn, cn) = m(x, (h0, c0)) if st else m(x)
            loss = (out * r1).sum() + (hn[-1] * r2).sum()
            loss.backward()
            emit(f, "x", x)
            if st:
                emit(f, "h0", h0)
                emit(f, "c0", c0)
            emit(f, "r1", r1)
            emit(f, "r2", r2)
            names = [f"{w}_l{k}" for k in range(L) for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            for n in names:
                emit(f, n, getattr(m, n))
            emit(f, "out", out)
            emit(f, "h_n", hn)
            emit(f, "c_n", cn)
            for n in names:
                emit(f, "grad." + n, getattr(m, n).grad)
            emit(f, "dx", x.grad)
            if st:
                emit(f, "dh0", h0.grad)
                emit(f, "dc0", c0.grad)


if __name__ == "__main__":
    main()
