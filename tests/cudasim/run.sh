#!/bin/sh
# make sim-test: the CUDA tests under the simulator, plain (the tests' full shapes), ASan
# and TSan (smaller shapes, MB_TEST_SMALL: the same code paths at a fraction of the time), the
# example against the CPU build in each, and the negative tests. One closing line per build.
#   run.sh BUILD TEST...
b=$1; shift
status=0
for v in sim sim-asan sim-tsan; do
    start=$(date +%s)
    bins=""
    for t in "$@"; do
        # the poison test's kernel faults; recovering from that SIGSEGV siglongjmps out of a fiber,
        # which TSan cannot follow (it runs plain and under ASan)
        if [ $v = sim-tsan ] && [ $t = test_cuda_poison ]; then echo "$t: not under TSan"; continue; fi
        bins="$bins $b/$v/$t"
    done
    extra=tests/cudasim/example.sh
    [ $v = sim ] && extra="tests/cudasim/neg.sh $extra" # neg.sh runs all three builds itself
    echo "== $v"
    export SIM_VARIANT=$v
    # TSan: smaller shapes, and a jitter of up to 1 ms before one stream operation in 32 (other
    # interleavings; TSan's view of the stream order does not depend on timing)
    [ $v = sim-asan ] && export MB_TEST_SMALL=1 MB_EXAMPLE_BARS=20000
    [ $v = sim-tsan ] && export MB_TEST_SMALL=1 MB_EXAMPLE_BARS=16000 CUDASIM_DELAY_US=1000 CUDASIM_DELAY_EVERY=32
    # the scripts first: the example is the longest, and the tests run beside it (MB_TEST_JOBS)
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 TSAN_OPTIONS=halt_on_error=1 \
        sh tests/run.sh $extra $bins || status=1
    echo "$v: $(($(date +%s) - start)) s"
done
exit $status
