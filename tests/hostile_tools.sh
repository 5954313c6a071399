#!/bin/sh
# Every program that reads a data file, over every hostile or odd HDF5 file the project has:
# the CVE corpus (MB_CVE_DIR, default ../shared/testdata/hdf5-cve; left out, saying so, when
# absent), tests/fuzz/regress and tests/fuzz/seeds (docs/RELIABILITY.md, "Every tool").
# Each run must end in exit 0 (it ran) or exit 2 with exactly one `error: ` line on stderr
# (a clean refusal): never a signal, never another exit status, never past LIMIT seconds,
# never an HDF5 error stack (HDF5-DIAG) on stdout or stderr. A refusal must be about the
# file: an error about the command line (an unknown flag, a flag without its value) fails,
# and so does any exit but 0 on a VALID seed (below: files every program must run on, each
# build but a CUDA one on a machine without a GPU, which must refuse at the device, saying so;
# with predict given a model trained on that file), so stale flags in TOOLS cannot turn
# every run into a "clean refusal".
#
# TOOLS below says how a file reaches each program (@ is the file). Every build of it that
# exists runs: build/NAME over all the files; build/NAME_cuda (nvcc: it opens the data before
# the device, so it runs here without a GPU) and build/NAME_mpi (a world of one), the same
# source, over tests/fuzz/regress and tests/fuzz/seeds (each start of a CUDA build costs
# ~0.3 s: the whole corpus would add minutes). The guard: a program under
# examples/ or bench/ whose source (or a .c it includes) calls mba_open_data, the one way to
# open a user's data file (examples/mb_args.h), must be in TOOLS or in OWN_FILES (programs
# that read back only a file they wrote); and no source there but mb_args.h may call
# mb_dataset_open_file, mb_dataset_open_untrusted or H5Fopen. So a new tool cannot skip this.
# One more may: examples/mb_walk.h reads `times` (which the library does not read) with H5Fopen
# in a forked child under a timeout, as the probe reads a file, after mba_open_data has probed
# the same file (train_multitf --walk-forward; tests/test_walk.c runs it over the CVE corpus
# and the fuzz sets).
#   sh tests/hostile_tools.sh [FILE.h5 ...]      (run from anywhere; default: the three sets)
# Env: B (build dir, default build), LIMIT (seconds per run, default 30), JOBS (parallel runs,
# default 2), MB_PROBE_TIMEOUT (the tools' probe timeout, default here 2 s).
cd "$(dirname "$0")/.." || exit 2
B=${B:-build} LIMIT=${LIMIT:-30} JOBS=${JOBS:-2}
export MB_PROBE_TIMEOUT=${MB_PROBE_TIMEOUT:-2}
TOOLS='
inspect            @
predict            --model MODEL --data @ --out TMP/p.csv --quiet
train_multitf      --train @ --val @ --epochs 1 --max-batches 1 --batch 4 --hidden 2 --head 2 --quiet
train_minimal      --train @ --val @ --epochs 1 --batch 4 --hidden 2
bench/bench_series --window @ --series @ --reps 1 --epochs 1 --batch 4
'
OWN_FILES='prepare bench_loader'
# the seeds that are valid training files (tests/fuzz/gen_seeds.c): every program runs on each
VALID='contig_f32 contig_n1 chunk_gzip latest_fletcher latest_gzip_segs types_i16_f64 types_be segments_names
segments_vlen series_valid series_f16_gzip'
set -eu
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# no GPU here: a CUDA build refuses at the device, after the file's checks (counted as such)
MB_HT_NOGPU=1; if nvidia-smi -L >/dev/null 2>&1; then MB_HT_NOGPU=0; fi
export MB_HT_NOGPU
pass=0 fail=0 skipped=0
bad() { echo "FAIL $*"; fail=$((fail + 1)); }

# ---- the guard ----
names=$(echo "$TOOLS" | awk 'NF {n = $1; sub(/.*\//, "", n); print n}')
for src in examples/*.c examples/*.cu bench/*.c bench/*.cu; do
    prog=$(basename "$src"); prog=${prog%.*}; base=${prog%_cuda}; base=${base%_mpi}
    # the source and the example/bench .c files it includes
    files="$src $(sed -n 's/^#include "\([a-z_]*\.c\)".*/\1/p' "$src" | sed "s|^|$(dirname "$src")/|")"
    if cat $files | grep -q 'mba_open_data('; then
        if echo "$names $OWN_FILES" | tr ' ' '\n' | grep -qx "$base"; then pass=$((pass + 1))
        else bad "$src reads a data file (mba_open_data) but is not in tests/hostile_tools.sh's TOOLS"; fi
    fi
done
direct=$(grep -ln 'mb_dataset_open_file(\|mb_dataset_open_untrusted(\|H5Fopen(' examples/*.c examples/*.cu examples/*.h \
         bench/*.c bench/*.cu 2>/dev/null | grep -v '^examples/mb_args.h$' | grep -v '^examples/mb_walk.h$' || true)
if [ -n "$direct" ]; then bad "opens data files other than through mba_open_data: $direct"; else pass=$((pass + 1)); fi

# ---- the files ----
for v in $VALID; do
    if [ -f "tests/fuzz/seeds/$v.h5" ]; then echo "tests/fuzz/seeds/$v.h5"
    else bad "the valid seed tests/fuzz/seeds/$v.h5 is missing"; fi
done > "$tmp/valid"
cve=${MB_CVE_DIR:-../shared/testdata/hdf5-cve}
if [ $# -eq 0 ]; then
    ls tests/fuzz/regress/*.h5 tests/fuzz/seeds/*.h5 > "$tmp/files_builds"
    if [ -d "$cve" ]; then set -- "$cve"/*.h5
    elif [ "${CI:-}" = true ]; then bad "no CVE corpus at $cve (set MB_CVE_DIR; CI=true: a corpus left out fails)"
    else echo "skipped: no CVE corpus at $cve (set MB_CVE_DIR): left out"; skipped=1; fi
    set -- "$@" tests/fuzz/regress/*.h5 tests/fuzz/seeds/*.h5
    ls "$@" > "$tmp/files"
else
    ls "$@" > "$tmp/files"
    cp "$tmp/files" "$tmp/files_builds"
fi

# a small valid model for predict (any model: most files are refused before it matters), and
# for each valid seed a model trained on it (predict runs that file with its own model)
mkdir "$tmp/models"
if [ -x "$B/prepare" ] && [ -x "$B/train_multitf" ]; then
    "$B/prepare" --synthetic --bars 16000 --features 2 --targets 2 --stride 200 --quiet --out-train "$tmp/t.h5" \
        --out-val "$tmp/v.h5" && "$B/train_multitf" --train "$tmp/t.h5" --val "$tmp/v.h5" --epochs 1 --max-batches 1 \
        --hidden 2 --head 2 --quiet --export "$tmp/m.safetensors" > /dev/null || bad "making the model for predict"
    while read -r f; do
        "$B/train_multitf" --train "$f" --val "$f" --epochs 1 --max-batches 1 --batch 4 --hidden 2 --head 2 --quiet \
            --export "$tmp/models/$(basename "$f" .h5).safetensors" > "$tmp/train.log" 2>&1 ||
            bad "making the model of $f for predict: $(tail -n 1 "$tmp/train.log")"
    done < "$tmp/valid"
else
    bad "$B/prepare and $B/train_multitf are not built (make build)"
fi

# ---- the runs: one line per (program, file) into $tmp/runs ----
echo "$TOOLS" | while read -r name args; do
    [ -n "$name" ] || continue
    for v in "" _cuda _mpi; do
        bin="$B/$name$v"
        if [ -z "$v" ] && [ ! -x "$bin" ]; then bad "$bin is not built (make build builds it)"; continue; fi
        [ -x "$bin" ] || continue
        list=$tmp/files; [ -z "$v" ] || list=$tmp/files_builds
        while read -r f; do printf '%s\t%s\t%s\n' "$bin" "$f" "$args"; done < "$list"
    done
done > "$tmp/runs"
[ -s "$tmp/runs" ] || { echo "hostile-tools: no program built (make build first)"; bad "nothing ran"; }

# one run: the verdict line "ok ..." or "FAIL ..."
cat > "$tmp/one.sh" <<'EOF'
tmp=$1 limit=$2
bin=$(printf '%s' "$3" | cut -f 1) f=$(printf '%s' "$3" | cut -f 2) args=$(printf '%s' "$3" | cut -f 3)
d=$(mktemp -d "$tmp/run.XXXXXX")
model=$tmp/models/$(basename "$f" .h5).safetensors
[ -f "$model" ] || model=$tmp/m.safetensors
a=$(printf '%s' "$args" | sed "s|@|$f|g; s|MODEL|$model|g; s|TMP|$d|g")
rc=0
# shellcheck disable=SC2086
timeout -s KILL "$limit" "$bin" $a > "$d/out" 2> "$d/err" || rc=$?
lines=$(wc -l < "$d/err")
why=""
if [ $rc -eq 137 ]; then why="killed after $limit s (a hang)"
elif [ $rc -gt 128 ]; then why="signal $((rc - 128))"
elif [ $rc -ne 0 ] && [ $rc -ne 2 ]; then why="exit $rc (want 0 or 2)"
elif [ $rc -eq 2 ] && { [ "$lines" -ne 1 ] || ! head -n 1 "$d/err" | grep -q '^error: '; }; then
    why="exit 2 without exactly one 'error:' line"
elif grep -q 'HDF5-DIAG\|^ *#[0-9][0-9]*: ' "$d/out" "$d/err"; then why="an HDF5 error stack"
elif [ $rc -eq 2 ] && grep -q "^error: unknown flag\|^error: .* needs a value" "$d/err"; then
    why="refused its command line, not the file (stale flags in TOOLS?)"
elif [ $rc -ne 0 ] && grep -qxF "$f" "$tmp/valid"; then
    case "$bin" in *_cuda*) cuda=1 ;; *) cuda=0 ;; esac
    # a CUDA build on a machine without a GPU: the file passed every check (the data opens
    # before the device), then the device was refused, saying so
    if [ "$cuda" = 1 ] && [ "${MB_HT_NOGPU:-0}" = 1 ] && [ $rc -eq 2 ] && grep -q '^error: no usable CUDA GPU' "$d/err"
    then rc=nogpu; else why="exit $rc on a valid seed (want 0)"; fi
fi
if [ -n "$why" ]; then
    echo "FAIL $bin on $f: $why; stderr: $(head -c 300 "$d/err" | tr '\n' '|')"
else
    echo "ok $rc $(basename "$bin") $(basename "$f") $(head -c 120 "$d/err" | tr '\n' ' ')"
fi
rm -rf "$d"
EOF
start=$(date +%s)
tr '\n' '\0' < "$tmp/runs" > "$tmp/runs0"
xargs -0 -r -P "$JOBS" -n 1 sh "$tmp/one.sh" "$tmp" "$LIMIT" < "$tmp/runs0" > "$tmp/verdicts" 2>&1 || bad "xargs: exit $?"
grep '^FAIL' "$tmp/verdicts" || true
count() { grep -c "$1" "$tmp/verdicts" || true; }
n_ok=$(count '^ok'); n_bad=$(count '^FAIL')
pass=$((pass + n_ok)); fail=$((fail + n_bad))
# every valid seed ran (exit 0) in every build that got it
n_valid=0
while read -r f; do n_valid=$((n_valid + $(grep -cF "	$f	" "$tmp/runs" || true))); done < "$tmp/valid"
n_valid_ran=$(grep -c "^ok \(0\|nogpu\) [^ ]* \($(tr '\n' ' ' < "$tmp/valid" | sed 's|tests/fuzz/seeds/||g; s| *$||; s|\.|\\.|g; s| |\\\||g')\) " "$tmp/verdicts" || true)
if [ "$n_valid" -gt 0 ] && [ "$n_valid_ran" -eq "$n_valid" ]; then pass=$((pass + 1))
else bad "$n_valid_ran of the $n_valid runs on valid seeds ran (exit 0; a CUDA build without a GPU: refused at the device)"; fi
echo "runs: $(wc -l < "$tmp/runs") ($(wc -l < "$tmp/files") files), $(count '^ok 0 ') ran" \
     "($n_valid_ran of them on the $(wc -l < "$tmp/valid") valid seeds), $(count '^ok 2 ') refused cleanly, $n_bad failed," \
     "$(( $(date +%s) - start )) s"
echo "hostile-tools: $pass passed, $fail failed, $skipped skipped"
[ "$fail" -eq 0 ]
