#!/bin/sh
# triage.sh FILE... - run each fuzzer artifact through build/fuzz/fuzz_dataset (ASan+UBSan)
# and print one line per file: what ASan saw, where (the first frames outside the
# sanitizer runtime), and whether the first frame is in libhdf5 (HDF5's bug) or in
# megabatch / the entry (ours). Timeouts print the stack libFuzzer dumps after 5 s; an
# input that only crashes after earlier ones (or at exit) shows "no crash in-process".
BIN=${BIN:-build/fuzz/fuzz_dataset}
for f in "$@"; do
    out=$(ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=0 "$BIN" -timeout=5 "$f" 2>&1)
    kind=$(printf '%s\n' "$out" | grep -m1 -oE 'ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer): [a-zA-Z -]+|ALARM: working on the last Unit|fuzz_entry: [^(]+|runtime error: [^\n]*' | head -1)
    stack=$(printf '%s\n' "$out" | grep -E '^ +#[0-9]+ ' | grep -vE 'in (__interceptor|__sanitizer|__asan|malloc|calloc|realloc|free) |in __(interceptor|sanitizer|asan)|libclang_rt|fuzzer::|compiler-rt|sysdeps|nptl/|stdlib/abort|raise|libc\.so' \
             | sed -E -e 's/^ +#[0-9]+ 0x[0-9a-f]+ in ([^ ]+).*/\1/' -e 's/^ +#[0-9]+ 0x[0-9a-f]+ +\(.*\/([^/]+)\+(0x[0-9a-f]+)\).*/\1+\2/')
    frames=$(printf '%s\n' "$stack" | head -4 | tr '\n' ' ')
    via=$(printf '%s\n' "$stack" | grep -m1 -E '^(mb_|mb__|fz_)')
    first=$(printf '%s\n' "$frames" | awk '{print $1}')
    where=hdf5
    case "$first" in H5*|libhdf5*|"") ;; *) where=megabatch ;; esac
    [ -z "$kind" ] && { kind="no crash in-process (ASan build)"; where=-; }
    if printf '%s\n' "$out" | grep -q 'out-of-memory (used:'; then   # the RSS limit: no allocation stack
        kind="out-of-memory (RSS limit; rerun with -malloc_limit_mb or watch it in the plain build)"; where=-; frames=""; via=""
    fi
    printf '%s | %s | %s | %s| via %s\n' "$(basename "$f")" "$where" "$kind" "$frames" "${via:--}"
done
