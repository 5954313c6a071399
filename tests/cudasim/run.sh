#!/bin/sh
# make sim-test: the CUDA tests under the simulator, plain, ASan+UBSan and TSan (smaller shapes:
# MB_TEST_SMALL), then its negative tests and the example against the CPU build. One closing
# line per build, then the total.   run.sh BUILD TEST...
b=$1; shift
status=0
for v in sim sim-asan sim-tsan; do
    start=$(date +%s)
    bins=""
    for t in "$@"; do bins="$bins $b/$v/$t"; done
    case $v in
    sim) extra="tests/cudasim/neg.sh tests/cudasim/example.sh" ;;
    *) extra="" ;;
    esac
    echo "== $v"
    [ $v = sim-tsan ] && export MB_TEST_SMALL=1
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 TSAN_OPTIONS=halt_on_error=1 \
        sh tests/run.sh $bins $extra || status=1
    echo "$v: $(($(date +%s) - start)) s"
done
exit $status
