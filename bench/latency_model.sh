#!/bin/sh
# latency_model.sh [BUILD]: the GPU latency model of issue 15 (docs/BENCHMARKS.md, "Latency
# model"). For the example's default shape (B 128, H 32, head 64, F 12, K 36) and the seeds'
# shape (F 128), it counts what one training step launches by running the CUDA example under the
# simulator (BUILD/sim/train_multitf_cuda; runs of 1 and 2 training steps, the difference is one
# step: validation and setup cancel), adds the step's FLOPs and HBM bytes from the shapes, and
# estimates an H100 step time three ways: as launched (host-bound), as one graph with the
# persistent fused kernel (the target structure), and PyTorch's cuDNN nn.LSTM.
# Every assumption is a variable below, printed with the result. Needs BUILD/prepare and
# BUILD/sim/train_multitf_cuda (make build/prepare build/sim/train_multitf_cuda). CPU only.
set -eu
b=${1:-build}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
for x in "$b/prepare" "$b/sim/train_multitf_cuda"; do
    [ -x "$x" ] || { echo "latency_model.sh: $x missing (make $x)" >&2; exit 1; }
done
# ---- assumptions (H100 SXM; public figures, to be checked with tests/gpu/run.sh) ----
LAUNCH_US=4      # host time per kernel launch or cuBLAS call on a stream (2.5-6 us, issue 15)
NODE_US=1.5      # GPU-side cost per dependent kernel (launch latency inside a graph or a busy queue)
GRAPH_US=10      # host time of one cudaGraphLaunch
TFLOPS=400       # sustained gemm throughput, bf16 tensor cores (989 peak dense, small gemms)
GBS=2500         # sustained HBM bandwidth, GB/s (3350 peak)
STEP_F_US=1.0    # persistent fused kernel: one recurrence step, forward (W_hh on chip)
STEP_B_US=1.5    # ... one recurrence step, backward
CUDNN_STEP_US=5  # cuDNN LSTM forward+backward per timestep per layer (DESIGN.md section 5)
SYNC_US=20       # a host sync: the queue drains, the host's next launch starts on an idle GPU
# ---- the example's shape ----
B=128 H=32 HEAD=64 K=36 S=5 TSUM=1104 TMAX=480
counts() { # F: kernels, cuBLAS calls, host syncs, H2D bytes of one training step
    "$b/prepare" --synthetic --bars ${MB_LM_BARS:-24000} --features "$1" --stride 40 --quiet \
        --out-train "$d/t.h5" --out-val "$d/v.h5"
    for n in 1 2; do
        "$b/sim/train_multitf_cuda" --train "$d/t.h5" --val "$d/v.h5" --epochs 1 --max-batches $n --quiet \
            --batch $B --hidden $H --head $HEAD 2>&1 | grep '^cudasim:' >"$d/c$n"
    done
    awk 'FNR == 1 { for (i = 1; i <= NF; i++) { if ($(i+1) == "kernel") k[FILENAME] = $i; if ($(i+1) == "cuBLAS") c[FILENAME] = $i
                                               if ($(i+1) == "host") s[FILENAME] = $i; if ($(i+1) == "MB" && $(i+2) == "H2D,") h[FILENAME] = $i } }
         END { f1 = ARGV[1]; f2 = ARGV[2]; print k[f2] - k[f1], c[f2] - c[f1], s[f2] - s[f1], (h[f2] - h[f1]) * 1e6 }' "$d/c1" "$d/c2"
}
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "assumptions: launch ${LAUNCH_US} us/call, graph node ${NODE_US} us, graph launch ${GRAPH_US} us, gemm ${TFLOPS} TFLOP/s,"
echo "  HBM ${GBS} GB/s, fused step ${STEP_F_US}+${STEP_B_US} us (fwd+bwd), cuDNN ${CUDNN_STEP_US} us/timestep fwd+bwd"
echo "estimated H100 step time, ms: as launched now; the same launches as one graph; the target (one graph of"
echo "  <= 100 nodes with the persistent fused LSTM kernel); PyTorch cuDNN (encoders one after another)"
printf '%-6s %8s %7s %5s %6s %7s %9s %9s %8s %7s %s\n' shape kernels cuBLAS syncs GFLOP HBM_MB launched one_graph target cuDNN cuDNN/target
for F in 12 128; do
    set -- $(counts $F)
    awk -v kern="$1" -v cub="$2" -v syncs="$3" -v h2d="$4" -v B=$B -v H=$H -v HEAD=$HEAD -v K=$K -v S=$S \
        -v TSUM=$TSUM -v TMAX=$TMAX -v F=$F -v L=$LAUNCH_US -v N=$NODE_US -v G=$GRAPH_US -v TF=$TFLOPS -v BW=$GBS \
        -v SF=$STEP_F_US -v SB=$STEP_B_US -v CU=$CUDNN_STEP_US -v SY=$SYNC_US 'BEGIN {
        G4 = 4 * H
        flop = 3 * 2 * B * TSUM * G4 * (F + H) + 3 * 2 * B * (S * H * HEAD + HEAD * K) # gemms: forward, dX, dW
        P = S * (G4 * (F + H) + 2 * G4) + S * H * HEAD + HEAD + HEAD * K + K            # parameters
        act = B * TSUM * 4 * (2 * F + 2 * G4 + 2 * 6 * H + 2 * G4)                     # x twice, xW, h/c/gates, dG
        bytes = act + 9 * P * 4 + h2d                                                   # + optimizer passes + batch
        work = flop / (TF * 1e12) * 1e3 + bytes / (BW * 1e9) * 1e3                       # ms, gemm + traffic
        host = (kern + cub) * L / 1e3                                                   # ms to launch it all
        chain = (kern + cub) * TMAX / TSUM * N / 1e3                                    # encoders side by side
        as_run = (host > chain + work ? host : chain + work) + syncs * SY / 1e3
        graph = G / 1e3 + chain + work                                                  # host cost gone
        fused = G / 1e3 + TMAX * (SF + SB) / 1e3 + 100 * N / 1e3 + work                 # <= 100 nodes, 1 graph
        cudnn = TSUM * CU / 1e3 + 40 * L / 1e3 + work                                   # + ~40 head/optimizer launches
        printf "F=%-4d %8d %7d %5d %6.1f %7.1f %9.2f %9.2f %8.2f %7.2f %9.1fx\n", F, kern, cub, syncs, flop / 1e9, bytes / 1e6,
               as_run, graph, fused, cudnn, cudnn / fused }'
done
