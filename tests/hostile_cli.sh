#!/bin/sh
# The hostile command-line corpus (docs/RELIABILITY.md, "The output-path rule" and "Hostile
# command lines"): every mistake of issue 46 by hand, and the same kinds of mistake generated
# for every flag of every tool from the tools' own flag tables (the {"--flag", MBA_KIND, dst,
# lo, hi, ...} lines of examples/prepare.c, mtf_options.h (train_multitf's), predict.c, inspect.c), so a new
# flag is in the corpus as soon as it is in a table:
#   every flag        given twice; without its value (last, or before another flag)
#   a number          abc, '', 12abc, 1e999, nan, below its range, above it, 1.5 (integers)
#   a choice          bogus, ''
#   an input file     a directory, a missing file, a file under a file, '', a file of junk
#   an output file    a directory, a file under a file, '', a missing directory (but where the
#                     tool makes it), the run's input (as typed, as ./NAME, through a link),
#                     another output of the run
# Each case must exit 2 with exactly one line on stderr, `error: ...` naming the flag or the
# value, nothing on stdout (but where a case says so), no internal function name (mb_x:) in
# it, and leave every file of its directory (the inputs and the earlier outputs) unchanged by
# checksum, with no file added or removed. A few checks after the corpus see that what
# should work does (a bad CSV row skipped and counted, --batch clamped, directories made).
# A path flag must be in INPUTS or OUTPUTS below (the guard): so a new tool's file flag
# cannot miss its cases.
#   sh tests/hostile_cli.sh        (from anywhere; B: the build directory, default build)
cd "$(dirname "$0")/.." || exit 2
B=${B:-build} LIMIT=${LIMIT:-60}
export MB_PROBE_TIMEOUT=${MB_PROBE_TIMEOUT:-5}
here=$(pwd)
pass=0 fail=0
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
for t in prepare train_multitf predict inspect; do
    [ -x "$B/$t" ] || { echo "hostile-cli: $B/$t missing (make $B/$t)"; echo "hostile-cli: 0 passed, 1 failed"; exit 1; }
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
W=$tmp/w
mkdir -p "$W"

# ---- the files: inputs and earlier outputs, in W ----
(cd "$W" &&
 "$here/$B/prepare" --synthetic --bars 20000 --stride 60 --features 4 --targets 2 --quiet \
     --out-train train.h5 --out-val val.h5 &&
 "$here/$B/prepare" --synthetic --bars 16000 --write-mt5 bars.csv --quiet &&
 "$here/$B/train_multitf" --train train.h5 --val val.h5 --epochs 1 --max-batches 2 --batch 8 --hidden 2 --head 2 \
     --quiet --export m.safetensors --ckpt c.ckpt --metrics m.csv >/dev/null &&
 "$here/$B/predict" --model m.safetensors --data val.h5 --out p.csv --quiet) ||
    { echo "hostile-cli: could not make the files"; echo "hostile-cli: 0 passed, 1 failed"; exit 1; }
(cd "$W" && mkdir adir od && ln -s val.h5 link.h5 && : > empty.csv && printf 'garbage\n' > junk.bin &&
 printf 'junk one\njunk two\njunk three\n' > alljunk.csv &&
 { head -n 2 bars.csv; echo "garbage row"; tail -n +3 bars.csv; } > junk3.csv &&
 { head -n 1 bars.csv; echo "garbage row"; tail -n +2 bars.csv; } > junk2.csv && cp bars.csv in.csv)

# ---- the tools: a base command that works, its inputs and outputs ----
# base_TOOL: flags and values (no value starts with --); a case drops from it the flag it tests
base_prepare="--csv bars.csv --out-train o1/t.h5 --out-val o1/v.h5 --features 4 --targets 2 --stride 60 --quiet"
base_train_multitf="--train train.h5 --val val.h5 --epochs 1 --max-batches 1 --batch 8 --hidden 2 --head 2 --quiet \
--metrics new.csv --ckpt new.ckpt"
base_predict="--model m.safetensors --data val.h5 --out new.csv --quiet"
base_predict_live="--model m.safetensors --live --csv bars.csv --quiet --out new.csv"
base_predict_onnx="--model m.safetensors --to-onnx new.onnx"
base_inspect="val.h5"
INPUTS=" --csv --train --val --init --model --data "
OUTPUTS=" --out-train --out-val --write-mt5 --metrics --plot --ckpt --export --export-onnx --out --to-onnx "
MKDIRS=" prepare:--out-train prepare:--out-val " # outputs whose directories the tool makes
SRC_prepare=examples/prepare.c SRC_train_multitf=examples/mtf_options.h SRC_predict=examples/predict.c
SRC_inspect=examples/inspect.c

# the base a flag's cases start from (predict: --csv, --live, --stateful need --live's; --to-onnx its own)
base_of() { # TOOL FLAG
    case "$1:$2" in
    predict:--csv | predict:--live | predict:--stateful) echo "$base_predict_live" ;;
    predict:--to-onnx) echo "$base_predict_onnx" ;;
    *) eval "echo \"\$base_$1\"" ;;
    esac
}
# the base without FLAG (and its value)
without() { # BASE FLAG
    echo "$1" | awk -v f="$2" '{ out = ""; for (i = 1; i <= NF; i++) { if ($i == f) { if (i < NF && $(i + 1) !~ /^--/) i++; continue }
        out = out (out == "" ? "" : " ") $i } print out }'
}
# the values of the base's flags of a kind (INPUTS or OUTPUTS), but FLAG's
values_of() { # BASE LIST FLAG
    echo "$1" | awk -v list="$2" -v f="$3" '{ for (i = 1; i < NF; i++) if (index(list, " " $i " ") && $i != f && $(i + 1) !~ /^--/) print $(i + 1) }'
}

cases=$tmp/cases
: > "$cases"
add() { printf '%s|%s|%s\n' "$1" "$2" "$3" >> "$cases"; } # TOOL WANT ARGS (TOOL +NAME: stdout allowed)

# ---- by hand: every case of issue 46 ----
add prepare "is the input --csv 'in.csv'" "--csv in.csv --out-train in.csv --out-val v.h5 --quiet"
add train_multitf "is the input --train 'train.h5'" "--train train.h5 --val val.h5 --export train.h5"
add predict "is the input --data 'val.h5'" "--model m.safetensors --data val.h5 --out val.h5"
add train_multitf "--plot 'm2.csv' is also --metrics 'm2.csv'" "--train train.h5 --val val.h5 --metrics m2.csv --plot m2.csv"
add train_multitf "--export 'c2' is also --ckpt 'c2'" "--train train.h5 --val val.h5 --ckpt c2 --export c2"
add train_multitf "is also --ckpt 'c.ckpt'" "--train train.h5 --val val.h5 --ckpt c.ckpt --export ./c.ckpt"
add prepare "--out-val 'od/t.h5' is also --out-train 'od/t.h5'" "--synthetic --bars 20000 --out-train od/t.h5 --out-val od/t.h5"
add prepare "is also --out-train 'od/t.h5'" "--synthetic --bars 20000 --out-train od/t.h5 --out-val ./od/../od/t.h5"
add prepare "is also --out-train 'n1/t.h5'" "--synthetic --bars 20000 --out-train n1/t.h5 --out-val n1/./t.h5"
add prepare "is the input --csv 'bars.csv'" "--csv bars.csv --write-mt5 ./bars.csv"
add predict "is the input --data 'link.h5'" "--model m.safetensors --data link.h5 --out val.h5"
add predict "is the input --model 'm.safetensors'" "--model m.safetensors --to-onnx m.safetensors"
add train_multitf "is the input --init 'm.safetensors'" "--train train.h5 --val val.h5 --init m.safetensors --export m.safetensors"
add prepare "line 2: expected at least 6 fields" "--csv junk2.csv --out-train o2/t.h5 --out-val o2/v.h5"
add prepare "line 3: expected at least 6 fields" "--csv junk3.csv --out-train o2/t.h5 --out-val o2/v.h5"
add prepare "no bars in the input: all 2 rows are bad" "--csv alljunk.csv --skip-bad --out-train o2/t.h5 --out-val o2/v.h5"
add prepare "no bars in the input" "--csv empty.csv --out-train o2/t.h5 --out-val o2/v.h5"
add prepare "'adir' is a directory" "--csv adir --out-train o2/t.h5 --out-val o2/v.h5"
add predict "'adir' is a directory" "--model m.safetensors --live --csv adir"
add predict "no bars in 'empty.csv'" "--model m.safetensors --live --csv empty.csv"
add +predict "no bars in 'alljunk.csv': all 2 rows refused" "--model m.safetensors --live --csv alljunk.csv"
add train_multitf "--export 'adir': is a directory" "--train train.h5 --val val.h5 --export adir"
add train_multitf "--export-onnx 'adir': is a directory" "--train train.h5 --val val.h5 --export-onnx adir"
add train_multitf "cannot open 'missing.ckpt'" "--train train.h5 --val val.h5 --resume --ckpt missing.ckpt"
add train_multitf "bad magic" "--train train.h5 --val val.h5 --resume --ckpt bars.csv"
add train_multitf "--metrics 'm.csv' is the input --ckpt 'm.csv'" "--train train.h5 --val val.h5 --resume --ckpt m.csv --metrics m.csv"
add inspect "'adir' is a directory" "adir"
add train_multitf "'adir' is a directory" "--train adir --val val.h5"
add predict "'adir' is a directory" "--model m.safetensors --data adir --out x.csv"
add train_multitf "--export '/nonexistent/m.safetensors': its directory '/nonexistent' does not exist" \
    "--train train.h5 --val val.h5 --export /nonexistent/m.safetensors"
add train_multitf "bars.csv is not a safetensors file" "--train train.h5 --val val.h5 --init bars.csv"
add predict "bars.csv is not a safetensors file" "--model bars.csv --data val.h5 --out x.csv"
add prepare "--val-fraction 1e-06 of" "--synthetic --bars 20000 --val-fraction 0.000001 --out-train o2/t.h5 --out-val o2/v.h5"
add prepare "--bars given twice ('30000', then '20000')" "--synthetic --bars 30000 --bars 20000"
add inspect "more than one file" "val.h5 train.h5"
add inspect "cannot open ''" "''"
if ! grep -q avx512f /proc/cpuinfo 2>/dev/null; then # the kernel by its name, where the CPU lacks it
    add train_multitf "the CPU kernel avx512" "--train train.h5 --val val.h5 --cpu-kernel avx512 --epochs 1 --max-batches 1"
else
    echo "note: this CPU runs AVX-512: the --cpu-kernel avx512 refusal is not reachable here"
fi

# ---- generated: the same kinds of mistake for every flag of every tool ----
unlisted=""
for tool in prepare train_multitf predict inspect; do
    eval "src=\$SRC_$tool"
    grep -o '{"--[a-z0-9-]*", MBA_[A-Z0-9]*, [^,]*, [^,]*, [^,}]*' "$src" |
        awk -F', ' '{ n = $1; sub(/^\{"/, "", n); sub(/"$/, "", n); print n, $2, $4, $5 }' > "$tmp/flags"
    [ -s "$tmp/flags" ] || bad "$src: no flag table found"
    while read -r flag kind lo hi; do
        base=$(without "$(base_of "$tool" "$flag")" "$flag")
        if [ "$kind" = MBA_SET ]; then ok=""; else ok=x; fi
        case "$kind" in MBA_INT | MBA_I64 | MBA_U64 | MBA_F32 | MBA_F64) ok=$lo ;; esac
        if [ "$kind" = MBA_CHOICE ]; then # its first choice: the array its table line names
            arr=$(grep -o -e "$flag\", MBA_CHOICE, [^,]*, 0, 0, [a-z_]*" "$src" | awk '{print $NF}' | head -n 1)
            ok=$(grep -o -e "$arr\[\] = {\"[a-z0-9]*\"" "$src" | head -n 1 | sed 's/.*{"//; s/"$//')
            # names made at run time (--schedule's, from the library): the tool's own refusal lists them
            [ -n "$ok" ] || ok=$("$B/$tool" "$flag" '?' 2>&1 | sed -n "s/.*'?': expected \([a-z0-9]*\).*/\1/p")
            [ -n "$ok" ] || { bad "$src: $flag: no choices found"; continue; }
        fi
        add "$tool" "$flag given twice" "$base $flag $ok $flag $ok"
        [ "$kind" = MBA_SET ] && continue
        add "$tool" "$flag needs a value" "$base $flag"
        add "$tool" "$flag needs a value" "$flag --bogus-next $base"
        case "$kind" in
        MBA_INT | MBA_I64 | MBA_U64 | MBA_F32 | MBA_F64)
            for v in abc "''" 12abc 1e999 nan; do add "$tool" "$flag '" "$base $flag $v"; done
            case "$lo$hi" in *[!0-9.e+-]*) ;; *) # numbers (not a name such as MAXF)
                add "$tool" "$flag '" "$base $flag $(awk "BEGIN { printf \"%.17g\", $lo - 1 }")"
                add "$tool" "$flag '" "$base $flag $(awk "BEGIN { printf \"%.17g\", $hi * 10 + 1 }")" ;;
            esac
            case "$kind" in MBA_F32 | MBA_F64) ;; *) add "$tool" "$flag '1.5'" "$base $flag 1.5" ;; esac ;;
        MBA_CHOICE)
            add "$tool" "$flag 'bogus': expected" "$base $flag bogus"
            add "$tool" "$flag '': expected" "$base $flag ''" ;;
        MBA_STR)
            if echo "$INPUTS" | grep -q " $flag "; then
                add "$tool" "adir" "$base $flag adir"
                add "$tool" "missing.x" "$base $flag missing.x"
                add "$tool" "bars.csv/x" "$base $flag bars.csv/x"
                add "$tool" "''" "$base $flag ''"
                add "$tool" "" "$base $flag junk.bin"
            elif echo "$OUTPUTS" | grep -q " $flag "; then
                add "$tool" "$flag 'adir': is a directory" "$base $flag adir"
                add "$tool" "$flag 'bars.csv/x': a part of the path is not a directory" "$base $flag bars.csv/x"
                add "$tool" "$flag '': an empty name" "$base $flag ''"
                echo "$MKDIRS" | grep -q " $tool:$flag " ||
                    add "$tool" "$flag 'nodir/x': its directory 'nodir' does not exist" "$base $flag nodir/x"
                for v in $(values_of "$base" "$INPUTS" "$flag"); do
                    add "$tool" "$flag '$v' is the input" "$base $flag $v"
                    add "$tool" "$flag './$v' is the input" "$base $flag ./$v"
                done
                [ "$tool:$flag" = predict:--out ] && add "$tool" "--out 'link.h5' is the input" "$base $flag link.h5"
                [ "$tool:$flag" = prepare:--write-mt5 ] && continue # its run writes nothing else
                for v in $(values_of "$base" "$OUTPUTS" "$flag"); do
                    add "$tool" "is also" "$base $flag $v"
                done
            else
                unlisted="$unlisted $tool:$flag"
            fi ;;
        esac
    done < "$tmp/flags"
done
if [ -n "$unlisted" ]; then bad "file flags in neither INPUTS nor OUTPUTS of tests/hostile_cli.sh:$unlisted"
else pass=$((pass + 1)); fi

# ---- the run: each case in W, every file of W the same after it ----
snapshot() { (cd "$W" && find . | LC_ALL=C sort && find . -type f -exec md5sum {} + | LC_ALL=C sort -k 2); }
snapshot > "$tmp/before"
n=0
while IFS='|' read -r tool want args; do
    n=$((n + 1))
    out_ok=0
    case "$tool" in +*) tool=${tool#+}; out_ok=1 ;; esac
    eval "set -- $args"
    (cd "$W" && exec timeout -s KILL "$LIMIT" "$here/$B/$tool" "$@") > "$tmp/out" 2> "$tmp/err"
    rc=$?
    line=$(head -n 1 "$tmp/err")
    what="$tool $args"
    if [ "$rc" != 2 ]; then bad "$what: exit $rc, want 2 ($(head -c 300 "$tmp/err"))"
    elif [ "$(wc -l < "$tmp/err")" != 1 ] || [ "${line#error: }" = "$line" ]; then
        bad "$what: stderr is not one 'error:' line: $(head -c 400 "$tmp/err")"
    elif [ -n "$want" ] && ! printf '%s\n' "$line" | grep -qF -- "$want"; then bad "$what: '$line' lacks '$want'"
    elif printf '%s\n' "$line" | grep -qE '(^|[ (])(mb|mtf)[a-z0-9]*_[a-z0-9_]*: '; then bad "$what: an internal name: '$line'"
    elif [ "$out_ok" = 0 ] && [ -s "$tmp/out" ]; then bad "$what: stdout before the error: $(head -c 200 "$tmp/out")"
    else
        snapshot > "$tmp/after"
        if cmp -s "$tmp/before" "$tmp/after"; then pass=$((pass + 1))
        else bad "$what: the files changed: $(diff "$tmp/before" "$tmp/after" | head -n 6 | tr '\n' ' ')"
             snapshot > "$tmp/before"; fi
    fi
done < "$cases"
echo "hostile-cli: $n cases"

# ---- what should work does ----
S=$tmp/s
mkdir -p "$S"
cp "$W/bars.csv" "$W/junk2.csv" "$W/m.safetensors" "$W/train.h5" "$W/val.h5" "$S/"
check() { # WHAT COMMAND...: exit 0 wanted
    what=$1; shift
    if (cd "$S" && "$@") > "$tmp/out" 2> "$tmp/err"; then pass=$((pass + 1)); else bad "$what: exit $? ($(head -c 300 "$tmp/err"))"; fi
}
grep_out() { # WHAT PATTERN FILE
    if grep -q -- "$2" "$3"; then pass=$((pass + 1)); else bad "$1: no '$2' in $(head -c 300 "$3")"; fi
}
check "--skip-bad" "$here/$B/prepare" --csv junk2.csv --skip-bad --out-train n1/n2/t.h5 --out-val n1/n2/v.h5 --features 4 \
    --targets 2 --stride 60
grep_out "--skip-bad counts by reason" "skipped 1 bad rows (1 unparsable)" "$tmp/out"
[ -f "$S/n1/n2/t.h5" ] && [ -f "$S/n1/n2/v.h5" ] && [ -z "$(find "$S" -name '*.tmp')" ] && pass=$((pass + 1)) ||
    bad "prepare: n1/n2/ not made, or a .tmp left"
check "--live refuses a junk row" "$here/$B/predict" --model m.safetensors --live --csv junk2.csv --out live.csv
grep_out "--live names the refused row" "line 2,refused: line 2: expected at least 6 fields" "$S/live.csv"
check "--batch clamped" "$here/$B/train_multitf" --train train.h5 --val val.h5 --epochs 1 --max-batches 1 --batch 1000000 \
    --hidden 2 --head 2
grep_out "--batch clamped" "note: --batch 1000000 is more than the" "$tmp/err"
grep_out "--batch clamped: memory" "device memory [0-9.]* MB" "$tmp/out"
check "/dev/null as --out" "$here/$B/predict" --model m.safetensors --data val.h5 --out /dev/null --quiet
[ -c /dev/null ] && pass=$((pass + 1)) || bad "/dev/null is no longer a device"
echo "hostile-cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
