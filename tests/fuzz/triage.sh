#!/bin/sh
# triage.sh FILE... - run each fuzzer artifact through build/fuzz/fuzz_dataset (ASan+UBSan)
# and print one line per file: what ASan saw, where (the first frames outside the
# sanitizer runtime), and whether the first frame is in libhdf5 (HDF5's bug) or in
# megabatch / the entry (ours). Timeouts print the stack libFuzzer dumps after 5 s.
BIN=${BIN:-build/fuzz/fuzz_dataset}
for f in "$@"; do
    out=$(ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=0 "$BIN" -timeout=5 "$f" 2>&1)
    kind=$(printf '%s\n' "$out" | grep -m1 -oE 'ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer): [a-zA-Z -]+|ALARM: working on the last Unit|fuzz_entry: [^(]+|runtime error: [^\n]*' | head -1)
    stack=$(printf '%s\n' "$out" | grep -E '^ +#[0-9]+ ' | grep -vE 'in __(interceptor|sanitizer|asan)|libclang_rt|fuzzer::|compiler-rt|sysdeps|nptl/|stdlib/abort|raise|libc\.so' \
             | sed -E -e 's/^ +#[0-9]+ 0x[0-9a-f]+ in ([^ ]+).*/\1/' -e 's/^ +#[0-9]+ 0x[0-9a-f]+ +\(.*\/([^/]+)\+(0x[0-9a-f]+)\).*/\1+\2/')
    frames=$(printf '%s\n' "$stack" | head -4 | tr '\n' ' ')
    via=$(printf '%s\n' "$stack" | grep -m1 -E '^(mb_|mb__|fz_)')
    first=$(printf '%s\n' "$frames" | awk '{print $1}')
    where=hdf5
    case "$first" in H5*|libhdf5*|"") ;; *) where=megabatch ;; esac
    [ -z "$kind" ] && { kind="no crash in-process (ASan build)"; where=-; }
    printf '%s | %s | %s | %s| via %s\n' "$(basename "$f")" "$where" "$kind" "$frames" "${via:--}"
done
