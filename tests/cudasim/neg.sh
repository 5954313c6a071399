#!/bin/sh
# Negative tests of the simulator: each planted fault of neg.cu, built plain, with ASan and with
# TSan, must give its report; the fault-free run must give none. Prints the cmocka-style summary
# that tests/run.sh counts.   neg.sh BUILD (e.g. build)
b=${1:-build}
pass=0 fail=0
check() { # name binary case expected-pattern
    # CUDASIM_DELAY_US: jitter before each stream operation; TSan can miss a race whose two
    # accesses lie far apart in time, the jitter makes them overlap
    out=$( (TSAN_OPTIONS=halt_on_error=0 ASAN_OPTIONS=detect_leaks=0 CUDASIM_DELAY_US=3000 timeout 300 "$2" "$3") 2>&1)
    if printf '%s' "$out" | grep -q -- "$4"; then pass=$((pass + 1)); echo "ok   $1: $4"
    else fail=$((fail + 1)); echo "FAIL $1: no \"$4\" in:"; printf '%s\n' "$out" | tail -20; fi
}
clean() { # name binary: the fault-free run reports nothing
    out=$(timeout 300 "$2" ok 2>&1); rc=$?
    if [ $rc -eq 0 ] && ! printf '%s' "$out" | grep -q -e "WARNING: ThreadSanitizer" -e "ERROR: AddressSanitizer" -e "cudasim: kernel" -e "runtime error" -e "cudaError[A-Z]"; then
        pass=$((pass + 1)); echo "ok   $1: clean"
    else fail=$((fail + 1)); echo "FAIL $1 (exit $rc):"; printf '%s\n' "$out" | tail -20; fi
}
clean ok-plain $b/sim/neg
clean ok-asan $b/sim-asan/neg
clean ok-tsan $b/sim-tsan/neg
check streams $b/sim-tsan/neg streams "WARNING: ThreadSanitizer: data race"
check early_read $b/sim-tsan/neg early_read "WARNING: ThreadSanitizer: data race"
check nobarrier $b/sim-tsan/neg nobarrier "WARNING: ThreadSanitizer: data race"
check oob $b/sim-asan/neg oob "ERROR: AddressSanitizer: heap-buffer-overflow"
check divergent $b/sim/neg divergent "__syncthreads in divergent code"
check smem $b/sim/neg smem "65536 bytes of shared memory: cudaErrorInvalidValue"
echo "[  PASSED  ] $pass test(s)."
[ $fail -eq 0 ] || echo "[  FAILED  ] $fail test(s)."
[ $fail -eq 0 ]
