#!/bin/sh
# Negative tests of the simulator: each fault must give its report, each fault-free run none.
#  - neg.cu: small programs with one fault each, built plain, with ASan and with TSan;
#  - tests/cudasim/plant.sh: faults in real library sites (a wait, a sync, a check or an
#    allocation taken out of a copy of the sources), run by tests/cudasim/planted.cu built under
#    TSan from that copy (CUDASIM_PLANT names the site; none: the library as it is).
# One line per check (the table of docs/GPU.md, "What the simulator catches"), then the
# cmocka-style summary that tests/run.sh counts.   neg.sh BUILD (e.g. build)
b=${1:-build}
pass=0 fail=0
clean_out() { ! printf '%s' "$1" | grep -q -e "WARNING: ThreadSanitizer" -e "ERROR: AddressSanitizer" -e "cudasim: kernel" \
    -e "runtime error" -e "cudaError[A-Z]" -e "cudasim: the capture" -e "FAILED"; }
# check NAME PATTERN COMMAND...: the run's output has PATTERN
check() {
    name=$1 pat=$2
    shift 2
    out=$( (TSAN_OPTIONS=halt_on_error=0 ASAN_OPTIONS=detect_leaks=0 timeout 300 "$@") 2>&1)
    if printf '%s' "$out" | grep -q -- "$pat"; then pass=$((pass + 1)); echo "ok   $name: $pat"
    else fail=$((fail + 1)); echo "FAIL $name: no \"$pat\" in:"; printf '%s\n' "$out" | tail -20; fi
}
# clean NAME COMMAND...: the run succeeds and reports nothing
clean() {
    name=$1
    shift
    out=$(timeout 300 "$@" 2>&1); rc=$?
    if [ $rc -eq 0 ] && clean_out "$out"; then pass=$((pass + 1)); echo "ok   $name: clean"
    else fail=$((fail + 1)); echo "FAIL $name (exit $rc):"; printf '%s\n' "$out" | tail -20; fi
}
race="WARNING: ThreadSanitizer: data race"
host="points at no device or pinned allocation"
capture="under the simulator a failed capture is an error"

clean ok-plain $b/sim/neg ok
clean ok-asan $b/sim-asan/neg ok
clean ok-tsan $b/sim-tsan/neg ok
# CUDASIM_DELAY_US: jitter before each stream operation (the first three were written for it)
check streams "$race" env CUDASIM_DELAY_US=3000 $b/sim-tsan/neg streams
check early_read "$race" env CUDASIM_DELAY_US=3000 $b/sim-tsan/neg early_read
check nobarrier "$race" env CUDASIM_DELAY_US=3000 $b/sim-tsan/neg nobarrier
check oob "ERROR: AddressSanitizer: heap-buffer-overflow" $b/sim-asan/neg oob
check divergent "__syncthreads in divergent code" $b/sim/neg divergent
check smem "65536 bytes of shared memory: cudaErrorInvalidValue" $b/sim/neg smem
check hostptr "argument 1 (0x[0-9a-f]*) $host" $b/sim/neg hostptr
check hoststruct "argument 0, field x (0x[0-9a-f]*) $host" $b/sim/neg hoststruct
check backlog "$race" $b/sim-tsan/neg backlog
check finished "$race" $b/sim-tsan/neg finished
check unjoined "$capture" $b/sim/neg unjoined

# the library's own sites (tests/cudasim/plant.sh, through tests/cudasim/planted.cu), no delay
p=$b/sim-tsan/planted
clean planted-none $p
check loader_kick "$race" env CUDASIM_PLANT=loader_kick $p loader
check slab_reuse "$race" env CUDASIM_PLANT=slab_reuse $p loader
check lstm_fork "$race" env CUDASIM_PLANT=lstm_fork $p carry
check meter_landed "$race" env CUDASIM_PLANT=meter_landed $p carry
check carry_ckpt "$race" env CUDASIM_PLANT=carry_ckpt $p carry
check host_mask "kernel mb__k_adamw: argument [0-9]* (0x[0-9a-f]*) $host" env CUDASIM_PLANT=host_mask $p carry
check lstm_join "StreamCaptureUnjoined.*$capture" env CUDASIM_PLANT=lstm_join $p graph
echo "[  PASSED  ] $pass test(s)."
[ $fail -eq 0 ] || echo "[  FAILED  ] $fail test(s)."
[ $fail -eq 0 ]
