#!/bin/sh
# Planted faults on the CPU (issue 48; the CPU counterpart of tests/cudasim/neg.sh): each
# fault, planted in a copy of the code, must make the test written for it fail with its
# message, and the same build without the fault must pass. So a check that cannot fail, or
# that misses the path it names, shows here.
#  - runtime sites: copies of megabatch.h and examples/*.h in which a site below is taken
#    out when MB_PLANT names it (mb__planted, prepended to the copy); the tests built from
#    those copies (-O1, the plain C gemm) under BUILD/neg_cpu, rebuilt only when a copy
#    changed. Each site must be found exactly once after its anchor, or this fails: a site
#    that moved is updated here, never dropped in silence.
#  - script sites: a stale flag in hostile_tools.sh's TOOLS, a command block with no marker
#    for tests/docs/check.sh, test_cli on a usage line that lacks a flag.
# One line per check, then "neg-cpu: N passed, N failed" (tests/run.sh counts it).
#   sh tests/neg_cpu.sh            (make test runs it; B=build dir, default build)
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
root=$(pwd)
case $B in /*) ;; *) B=$root/$B ;; esac
W=$B/neg_cpu
mkdir -p "$W/src/examples" "$W/src/tests" "$W/bin"
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# ---- the copies, with the sites ----
new=$W/new
rm -rf "$new"; mkdir -p "$new/examples" "$new/tests"
{
    echo '#ifndef MB_PLANTED_DEFINED /* tests/neg_cpu.sh: MB_PLANT=NAME takes site NAME out */'
    echo '#define MB_PLANTED_DEFINED'
    echo '#include <stdlib.h>'
    echo '#include <string.h>'
    echo 'static inline int mb__planted(const char *name) { const char *p = getenv("MB_PLANT"); return p && !strcmp(p, name); }'
    echo '#endif'
    cat megabatch.h
} > "$new/megabatch.h"
cp examples/*.h "$new/examples/"
cp tests/*.c tests/*.h "$new/tests/"
cp tests/docs/snippets.c "$new/tests/snippets.c"
sites_bad=0
# site NAME FILE ANCHOR OLD NEW: in FILE (under the copy), the first line after the one line
# containing ANCHOR that contains OLD: OLD becomes NEW (text that tests mb__planted("NAME")).
site() {
    f="$new/$2"
    if awk -v name="$1" -v anchor="$3" -v old="$4" -v new="$5" '
        index($0, anchor) { anchors++; armed = anchors == 1 }
        armed && !done && (i = index($0, old)) { $0 = substr($0, 1, i - 1) new substr($0, i + length(old)); done = 1 }
        { print }
        END {
            if (anchors != 1 || !done) {
                printf "neg_cpu.sh: site %s: anchor \"%s\" found %d time(s), \"%s\" after it: %s\n", name, anchor, anchors,
                       old, done ? "yes" : "no"
                exit 1
            }
        }' "$f" > "$f.new"; then mv "$f.new" "$f"
    else bad "site $1 not found in $2"; sites_bad=1; rm -f "$f.new"; fi
}
P='mb__planted'
# the automatic checkpoint rule always picks full storage (memory ignored): test_lstm's
# forced-auto cases (bitwise, PyTorch golden, allocation failures) must see it
site auto_full megabatch.h 'MBDEF mb_result mb_lstm_create(mb_lstm **out, mb_params *params, const mb_lstm_config *cfg) {' 'mb__lstm_full_fits(dev, cfg)' \
    "($P(\"auto_full\") || mb__lstm_full_fits(dev, cfg))"
# the backward recomputes segment s from segment s-1's kept cell state (a checkpointed path
# only): the PyTorch golden at an interval of 2 must see it
site recompute_from megabatch.h 'static void mb__cpu_lstm_bwd_item(' 'y->cs + s * bh' "y->cs + ($P(\"recompute_from\") && s ? s - 1 : s) * bh"
# the segment cells' allocation unchecked (a checkpointed allocation): the allocation-failure
# loop must see a create that succeeded with a failed allocation
site seg_c_unchecked megabatch.h 'static mb_result mb__lstm_alloc_all(' 'MB_TRY(mb__lstm_alloc(l, &l->seg_c, s.seg_c));' \
    "if ($P(\"seg_c_unchecked\")) (void)mb__lstm_alloc(l, &l->seg_c, s.seg_c); else MB_TRY(mb__lstm_alloc(l, &l->seg_c, s.seg_c));"
# a CPU without AVX-512: the AVX-512 checks say they are skipped
site avx512_absent megabatch.h 'static int mb__rk_supported(int v) {' 'return __builtin_cpu_supports("avx512f");' \
    "return $P(\"avx512_absent\") ? 0 : __builtin_cpu_supports(\"avx512f\");"
# a larger model's optimizer state loaded from a smaller one's (its size taken from the file)
site adamw_any_size megabatch.h 'MBDEF mb_result mb_ckpt_load_adamw(mb_ckpt_reader *r, mb_adamw *o) {' 'size_t bytes = mb_params_total(o->params) * sizeof(float);' \
    "size_t bytes = mb_params_total(o->params) * sizeof(float); if ($P(\"adamw_any_size\")) mb_ckpt_has(r, \"adamw.m\", &bytes);"
# the NaN policy zero writes the previous value, not 0 (all still finite)
site nan_carry megabatch.h 'static int mb__ds_sample_policy(' 'if (!isfinite(feat[j])) feat[j] = 0.0f;' \
    "if (!isfinite(feat[j])) feat[j] = $P(\"nan_carry\") && j ? feat[j - 1] : 0.0f;"
# a safetensors tensor's element count one short (its data compared over that count)
site st_count megabatch.h 'static mb_result mb__st_check(' 't->count = bytes / mb__st_dtype_size(t->dtype);' \
    "t->count = bytes / mb__st_dtype_size(t->dtype) - ($P(\"st_count\") && bytes > 4);"
# the ONNX normalisation in the wrong order: (x / std) - mean, Div before Sub (both initializers
# still used, each node still reads what the one before wrote)
A='if (sp->has_norm) { /* (x - mean) / std'
site onnx_div_first examples/mtf_onnx.h "$A" '*sub_in[] = {x, n[2]}' "*sub_in[] = {$P(\"onnx_div_first\") ? n[5] : x, n[2]}"
site onnx_div_first_in examples/mtf_onnx.h "$A" '*div_in[] = {n[4], n[3]}' "*div_in[] = {$P(\"onnx_div_first\") ? x : n[4], n[3]}"
site onnx_div_first_sub examples/mtf_onnx.h "$A" 'mbo_node(g, "Sub", n[4], sub_in, 2, sub_out, 1, NULL, 0);' \
    "if (!$P(\"onnx_div_first\")) mbo_node(g, \"Sub\", n[4], sub_in, 2, sub_out, 1, NULL, 0);"
site onnx_div_first_div examples/mtf_onnx.h "$A" 'mbo_node(g, "Div", n[5], div_in, 2, div_out, 1, NULL, 0);' \
    "mbo_node(g, \"Div\", n[5], div_in, 2, div_out, 1, NULL, 0); if ($P(\"onnx_div_first\")) mbo_node(g, \"Sub\", n[4], sub_in, 2, sub_out, 1, NULL, 0);"
site onnx_div_first_x examples/mtf_onnx.h "$A" 'snprintf(x, 64, "%s", n[5]);' "snprintf(x, 64, \"%s\", n[$P(\"onnx_div_first\") ? 4 : 5]);"
# the fc weights declared one column short (the file's own length then covers only part)
site onnx_fc_cols examples/mtf_onnx.h 'MTF_API void mtf_onnx_linear(' 'int64_t wd[2] = {rows, cols};' \
    "int64_t wd[2] = {rows, cols - ($P(\"onnx_fc_cols\") ? 1 : 0)};"
# gradient accumulation never completes a window: no optimizer step (the docs' numerics-step)
site accum_never megabatch.h 'MBDEF int mb_accum_tick(mb_accum *a) {' 'if (++a->micro < a->n) return 0;' \
    "if (++a->micro < a->n || $P(\"accum_never\")) return 0;"

# ---- the builds (only what changed) ----
if [ "$sites_bad" -eq 0 ]; then
    for f in megabatch.h $(cd "$new" && ls examples/*.h tests/*.c tests/*.h); do
        mkdir -p "$(dirname "$W/src/$f")"
        cmp -s "$new/$f" "$W/src/$f" || cp "$new/$f" "$W/src/$f"
    done
fi
CFLAGS_NEG="-std=c11 -O1 -w -DMEGABATCH_NO_CBLAS -I$W/src -I$W/src/tests $(pkg-config --cflags hdf5 2>/dev/null) -pthread"
LIBS_NEG="$(pkg-config --libs cmocka 2>/dev/null) $(pkg-config --libs hdf5 2>/dev/null) -lpthread -lm"
build() { # NAME SOURCE [FLAGS]: $W/bin/NAME from the copy, when older than the copy's headers or its source
    name=$1 src=$W/src/$2; shift 2
    if [ ! -x "$W/bin/$name" ] || [ -n "$(find "$W/src" -newer "$W/bin/$name" -type f | head -n 1)" ]; then
        # shellcheck disable=SC2086
        ${CC:-cc} $CFLAGS_NEG "$@" -o "$W/bin/$name.tmp" "$src" $LIBS_NEG > "$W/bin/$name.log" 2>&1 &&
            mv "$W/bin/$name.tmp" "$W/bin/$name" || { bad "build $name: $(tail -n 3 "$W/bin/$name.log")"; return 1; }
    fi
}
log=$W/run.log
# check NAME BIN PATTERN: with MB_PLANT=NAME, BIN (run from the repository root, seed 1) fails
# with PATTERN in its output
check() {
    name=$1 bin=$2 pat=$3 rc=0
    MB_PLANT=$name MB_TEST_SEED=1 "$W/bin/$bin" > "$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ] && grep -q -- "$pat" "$log"; then
        ok "$name: $bin fails: $( { grep -m 1 -e '^ERROR: ' -e '\[  ERROR   \] --- ' "$log" || grep -m 1 -- "$pat" "$log"; } |
                                   cut -c 1-160)"
    else bad "$name: $bin exit $rc, no \"$pat\" in:"; tail -n 15 "$log"; fi
}
# clean BIN: without a plant, the copy's BIN passes (the faults above are the plants' doing)
clean() {
    rc=0
    MB_TEST_SEED=1 "$W/bin/$1" > "$log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then ok "none: $1 passes"; else bad "none: $1 exit $rc:"; tail -n 15 "$log"; fi
}

if [ "$sites_bad" -eq 0 ]; then
    if build test_lstm tests/test_lstm.c; then
        clean test_lstm
        check auto_full test_lstm 'checkpoint -1000 at T=[0-9]*: the LSTM takes -1'
        check recompute_from test_lstm 'FAILED  \] test_golden_torch'
        check seg_c_unchecked test_lstm 'FAILED  \] test_alloc_failure_leaks_nothing'
        rc=0; MB_PLANT=avx512_absent MB_TEST_SEED=1 "$W/bin/test_lstm" > "$log" 2>&1 || rc=$?
        if [ $rc -eq 0 ] && grep -q '^skipped: this CPU has no AVX-512' "$log" && grep -q 'SKIPPED \] test_avx512_kernels' "$log"
        then ok "avx512_absent: test_lstm says: $(grep -m 1 '^skipped: ' "$log")"
        else bad "avx512_absent: no 'skipped: this CPU has no AVX-512' line and skipped test (exit $rc)"; tail -n 8 "$log"; fi
    fi
    if build test_checkpoint tests/test_checkpoint.c; then
        clean test_checkpoint
        check adamw_any_size test_checkpoint 'FAILED  \] test_wrong_shape_refused'
    fi
    if build test_series tests/test_series.c; then
        clean test_series
        check nan_carry test_series 'NaN zero: sample [0-9]* value [0-9]* is'
    fi
    if build test_export tests/test_export.c; then
        clean test_export
        check st_count test_export 'FAILED  \] test_write_read_roundtrip'
    fi
    if build test_onnx tests/test_onnx.c; then
        clean test_onnx
        check onnx_div_first test_onnx 'segment [0-9]*: Div reads the output of Slice'
        check onnx_fc_cols test_onnx 'fc[12].weight: rank 2, ([0-9]*, [0-9]*), [0-9]* bytes; want'

    fi
fi

# ---- script sites ----
# hostile_tools.sh with a stale flag for train_multitf: its refusals of the command line fail
# (the copy in a tree of links: W/hs/tests/hostile_tools.sh, build, examples, bench, tests/fuzz)
h=$W/hs; rm -rf "$h"; mkdir -p "$h/tests"
ln -s "$B" "$h/build"; ln -s "$root/examples" "$h/examples"; ln -s "$root/bench" "$h/bench"; ln -s "$root/tests/fuzz" "$h/tests/fuzz"
sed 's/^train_multitf      --train @ --val @ --epochs 1 --max-batches 1/train_multitf      --train @ --val @ --epochs 1 --max-batch 1/' \
    tests/hostile_tools.sh > "$h/tests/hostile_tools.sh"
if cmp -s tests/hostile_tools.sh "$h/tests/hostile_tools.sh"; then bad "stale_flag: the train_multitf row of TOOLS moved"
else
    rc=0; (cd "$h" && JOBS=2 sh tests/hostile_tools.sh tests/fuzz/seeds/contig_f32.h5 tests/fuzz/seeds/soft_link.h5) > "$log" 2>&1 || rc=$?
    if [ $rc -ne 0 ] && grep -q 'refused its command line' "$log"; then ok "stale_flag: hostile_tools.sh fails: $(grep -m 1 'refused its command line' "$log" | cut -c 1-150)"
    else bad "stale_flag: hostile_tools.sh exit $rc:"; tail -n 5 "$log"; fi
fi
# a command block with neither marker, and one whose snippet is in a script no test runs
md=$W/unmarked.md
printf '# t\n\n```sh\nbuild/prepare --synthetic\n```\n\n<!-- snippet: bench/ab_lstm.sh#x -->\n```sh\nx\n```\n' > "$md"
rc=0; sh tests/docs/check.sh "$md" > "$log" 2>&1 || rc=$?
if [ $rc -ne 0 ] && grep -q 'is neither run by a test' "$log" && grep -q 'is not a test script that the Makefile runs' "$log"
then ok "unmarked_block: check.sh fails: $(grep -m 1 'neither run' "$log" | cut -c 1-150)"
else bad "unmarked_block: check.sh exit $rc:"; tail -n 5 "$log"; fi
# the docs' snippets run on a library whose accumulation never steps
if [ "$sites_bad" -eq 0 ] && build snippets_run tests/snippets.c -DMB_SNIPPETS_MAIN; then
    d=$W/snip; rm -rf "$d"; mkdir -p "$d/run"
    if [ -x "$B/prepare" ] && "$B/prepare" --synthetic --bars 16000 --features 2 --targets 2 --stride 50 --quiet \
           --out-train "$d/train.h5" --out-val "$d/val.h5" > "$log" 2>&1; then
        cp "$d/train.h5" "$d/untrusted.h5"
        rc=0; (cd "$d" && MB_PLANT=accum_never "$W/bin/snippets_run") > "$log" 2>&1 || rc=$?
        if [ $rc -ne 0 ] && grep -q '^FAIL numerics-step' "$log"; then ok "accum_never: snippets_run fails: $(grep -m 1 '^FAIL' "$log")"
        else bad "accum_never: snippets_run exit $rc:"; tail -n 5 "$log"; fi
    else bad "snippets: $B/prepare is not built or failed (make build)"; fi
fi
# test_cli with a usage line that lacks --f (it still has --file): "--f" must not be found in it
if [ -x "$B/tests/test_cli" ]; then
    c=$W/cli; rm -rf "$c"; mkdir -p "$c/build/bench"
    ln -s "$root/examples" "$c/examples"; ln -s "$root/Makefile" "$c/Makefile"
    mkdir "$c/bench"; cp bench/*.c bench/*.cu "$c/bench/" 2>/dev/null || true
    sed -i 's/ \[--f 128\]//' "$c/bench/bench_loader.c"
    if grep -q '\[--f 128\]' "$c/bench/bench_loader.c"; then bad "usage_lacks_flag: bench_loader's usage moved"
    elif ${CC:-cc} -std=c11 -O1 -w -DMEGABATCH_NO_CBLAS -I. -Iexamples $(pkg-config --cflags hdf5) -pthread \
             -o "$c/build/bench/bench_loader" "$c/bench/bench_loader.c" $(pkg-config --libs hdf5) -lpthread -lm > "$log" 2>&1; then
        rc=0; (cd "$c" && env -u CI "$B/tests/test_cli") > "$log" 2>&1 || rc=$? # other builds: skipped here
        if [ $rc -ne 0 ] && grep -q 'bench_loader --help lacks --f$' "$log"; then ok "usage_lacks_flag: test_cli fails: $(grep -m 1 'lacks --f' "$log")"
        else bad "usage_lacks_flag: test_cli exit $rc:"; tail -n 8 "$log"; fi
    else bad "usage_lacks_flag: build: $(tail -n 3 "$log")"; fi
else bad "$B/tests/test_cli is not built (make build)"; fi
echo "neg-cpu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
