#!/bin/sh
# latency_model.sh [BUILD]: the GPU latency model of issue 15 (docs/BENCHMARKS.md, "Latency
# model"). For the example's default shape (B 128, H 32, head 64, F 12, K 36; bf16, the GPU
# default) and the seeds' shape (F 128), it counts what one training step runs by running the CUDA
# example under the simulator (BUILD/sim/train_multitf_cuda, 3 training steps: the summary's
# launches_per_step, graphs_per_step, syncs_per_step, the warm-up step left out), adds the step's
# FLOPs and HBM bytes from the shapes, and estimates an H100 step time: these launches made one
# by one (host-bound), as this build runs them (graphs: no host cost per launch), the issue's
# target (one graph of <= 100 nodes with the persistent fused kernel), and PyTorch's cuDNN.
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
counts() { # F: launches (kernels + cuBLAS), graph launches, host syncs per training step (the summary's)
    "$b/prepare" --synthetic --bars ${MB_LM_BARS:-24000} --features "$1" --stride 40 --quiet \
        --out-train "$d/t.h5" --out-val "$d/v.h5"
    "$b/sim/train_multitf_cuda" --train "$d/t.h5" --val "$d/v.h5" --epochs 1 --max-batches ${MB_LM_STEPS:-3} --quiet \
        --batch $B --hidden $H --head $HEAD --precision ${MB_LM_PRECISION:-bf16} 2>/dev/null |
        sed -n 's/^summary:.* launches_per_step=\([0-9.]*\) graphs_per_step=\([0-9.]*\) syncs_per_step=\([0-9.]*\).*/\1 \2 \3/p'
}
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "assumptions: launch ${LAUNCH_US} us/call, graph node ${NODE_US} us, graph launch ${GRAPH_US} us, gemm ${TFLOPS} TFLOP/s,"
echo "  HBM ${GBS} GB/s, fused step ${STEP_F_US}+${STEP_B_US} us (fwd+bwd), cuDNN ${CUDNN_STEP_US} us/timestep fwd+bwd"
echo "per training step: launches (kernels + cuBLAS calls, as graph nodes or not), graph launches, host syncs;"
echo "estimated H100 ms: the launches made one by one; as this build runs them; the target (one graph, <= 100"
echo "  nodes, the persistent fused LSTM kernel); PyTorch cuDNN (encoders one after another)"
printf '%-6s %8s %6s %5s %6s %7s %9s %9s %8s %7s %s\n' shape launches graphs syncs GFLOP HBM_MB one_by_one this_build target cuDNN cuDNN/target
for F in 12 128; do
    set -- $(counts $F)
    [ $# -eq 3 ] || { echo "latency_model.sh: no counters from the simulator run (F=$F)" >&2; exit 1; }
    awk -v nl="$1" -v graphs="$2" -v syncs="$3" -v B=$B -v H=$H -v HEAD=$HEAD -v K=$K -v S=$S \
        -v TSUM=$TSUM -v TMAX=$TMAX -v F=$F -v L=$LAUNCH_US -v N=$NODE_US -v G=$GRAPH_US -v TF=$TFLOPS -v BW=$GBS \
        -v SF=$STEP_F_US -v SB=$STEP_B_US -v CU=$CUDNN_STEP_US -v SY=$SYNC_US 'BEGIN {
        G4 = 4 * H
        flop = 3 * 2 * B * TSUM * G4 * (F + H) + 3 * 2 * B * (S * H * HEAD + HEAD * K) # gemms: forward, dX, dW
        P = S * (G4 * (F + H) + 2 * G4) + S * H * HEAD + HEAD + HEAD * K + K            # parameters
        act = B * TSUM * 4 * (2 * F + 2 * G4 + 2 * 6 * H + 2 * G4)                     # x twice, xW, h/c/gates, dG
        bytes = act + 9 * P * 4 + 2 * B * TSUM * F * 4                                 # + optimizer + batch copy
        work = flop / (TF * 1e12) * 1e3 + bytes / (BW * 1e9) * 1e3                       # ms, gemm + traffic
        host = nl * L / 1e3                                                             # ms to launch it all
        chain = nl * TMAX / TSUM * N / 1e3                                              # encoders side by side
        rec = nl < TSUM ? TMAX * (SF + SB) / 1e3 : 0   # fewer launches than timesteps: the fused recurrence
        plain = (host > chain + work + rec ? host : chain + work + rec) + syncs * SY / 1e3
        build = graphs >= 1 ? graphs * G / 1e3 + chain + work + rec + syncs * SY / 1e3 : plain  # host cost gone
        fused = G / 1e3 + TMAX * (SF + SB) / 1e3 + 100 * N / 1e3 + work                 # <= 100 nodes, 1 graph
        cudnn = TSUM * CU / 1e3 + 40 * L / 1e3 + work                                   # + ~40 head/optimizer launches
        printf "F=%-4d %8.0f %6.2f %5.2f %6.1f %7.1f %9.2f %9.2f %8.2f %7.2f %9.1fx\n", F, nl, graphs, syncs, flop / 1e9,
               bytes / 1e6, plain, build, fused, cudnn, cudnn / fused }'
done
