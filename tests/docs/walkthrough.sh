#!/bin/sh
# A walkthrough of a program's calls names calls the program makes. In README.md and docs/*.md
# the paragraph after a line
#     <!-- calls: examples/train_multitf.c ... -->
# (DESIGN.md's walk through one training step) may name only `mb_*` functions that the file
# calls: `name(` on a line of code, not in a comment. Each marker is one check; a marker on
# no paragraph, or on one that names no call, fails too. Ends with `walkthrough: N passed,
# N failed`.
cd "$(dirname "$0")/../.." || exit 2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
for md in README.md docs/*.md; do
    # one line per marker: "FILE<TAB>the paragraph joined"
    awk '/^<!-- calls: [^ ]+ .*-->$|^<!-- calls: [^ ]+-->$/ { f = $3; sub(/-->$/, "", f); on = 1; text = ""; next }
         on && NF { text = text " " $0; next }
         on && text != "" { print f "\t" text; on = 0 }
         on && !NF && text == "" { next }
         END { if (on) print f "\t" text }' "$md" > "$tmp/marks"
    while IFS="$(printf '\t')" read -r src text; do
        if [ ! -f "$src" ]; then echo "FAIL $md: <!-- calls: $src --> names no file"; fail=$((fail + 1)); continue; fi
        # the file's code: comments (// to the end of a line, /* ... */ across lines) taken out
        sed 's|//.*||' "$src" | awk '{ line = $0; out = "";
              while (line != "") {
                  if (inc) { i = index(line, "*/"); if (!i) { line = ""; break } line = substr(line, i + 2); inc = 0 }
                  i = index(line, "/*"); if (!i) { out = out line; break }
                  out = out substr(line, 1, i - 1); line = substr(line, i + 2); inc = 1 }
              print out }' > "$tmp/code"
        names=$(echo "$text" | grep -o '`mb_[a-z0-9_]*`' | tr -d '`' | sort -u)
        if [ -z "$names" ]; then echo "FAIL $md: the paragraph after <!-- calls: $src --> names no mb_* call"; fail=$((fail + 1)); continue; fi
        missing=""
        for n in $names; do grep -q "\\b$n(" "$tmp/code" || missing="$missing $n"; done
        if [ -n "$missing" ]; then
            echo "FAIL $md: its walkthrough of $src names calls $src does not make:$missing"; fail=$((fail + 1))
        else pass=$((pass + 1)); fi
    done < "$tmp/marks"
done
[ $((pass + fail)) -gt 0 ] || { echo "FAIL: no <!-- calls: FILE --> marker in README.md or docs/*.md"; fail=1; }
echo "walkthrough: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
