#!/bin/sh
# Choosing the model to trade, through build/train_multitf (docs/TRADING.md, "Choosing the model
# to trade"; examples/mb_select.h):
#   - --ema and --swa-start: each epoch line shows the averaged weights' validation loss, and the
#     exported file says which weights it holds (metadata "weights");
#   - a resume in the middle of an average (SWA from epoch 2, stopped after 2 of 4 epochs; EMA
#     stopped after 2) exports the same bytes as the uninterrupted run;
#   - --dropout: a resume in the middle continues the masks (the same bytes), and it changes the weights;
#   - --keep-best exports the best epoch, and build/predict --metrics on the validation file
#     gives the reported best_val_loss; --patience stops;
#   - --walk-forward: the same table twice, one file a fold with its own normalisation;
#     predict --metrics on it;
#   - bad flags: one `error:` line, exit 2, and nothing written.
# Usage: tests/select_cli.sh (from the repository root, after make build). Closes with
# "select-cli: N passed, N failed".
set -eu
B=${BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
field() { # FILE KEY: the value of KEY= in FILE's summary line
    sed -n "s/^summary:.* $2=\([^ ]*\).*/\1/p" "$1"
}

"$B/prepare" --synthetic --bars 30000 --features 2 --targets 3 --stride 40 --quiet \
    --out-train "$tmp/t.h5" --out-val "$tmp/v.h5"
T="$B/train_multitf --train $tmp/t.h5 --val $tmp/v.h5 --batch 32 --hidden 6 --head 8 --schedule constant --quiet"

# ---- averages: the epoch line, the metadata, a bitwise resume in the middle ----
for avg in "--swa-start 2" "--ema 0.9"; do
    name=$(echo "$avg" | tr -d ' -.')
    $T --epochs 4 $avg --export "$tmp/$name-a.safetensors" > "$tmp/$name-a.out"
    if grep -q '^epoch 4: .* avg_val_loss [0-9.]*' "$tmp/$name-a.out"; then ok; else bad "$avg: no avg_val_loss in the epoch line"; fi
    if grep -q '"weights":"\(SWA over epochs 2..4 (3 averaged)\|EMA decay 0.9 over [0-9]* steps\)"' "$tmp/$name-a.safetensors"
    then ok; else bad "$avg: the file's metadata does not say which weights: $(head -c 900 "$tmp/$name-a.safetensors" | tr -c '[:print:]' ' ')"; fi
    $T --epochs 2 $avg --ckpt "$tmp/$name.ckpt" > /dev/null
    $T --epochs 4 $avg --ckpt "$tmp/$name.ckpt" --resume --export "$tmp/$name-b.safetensors" > "$tmp/$name-b.out"
    if cmp -s "$tmp/$name-a.safetensors" "$tmp/$name-b.safetensors"; then ok; else bad "$avg: the resumed run's weights differ"; fi
    if [ "$(field "$tmp/$name-a.out" avg_val_loss)" = "$(field "$tmp/$name-b.out" avg_val_loss)" ]; then ok
    else bad "$avg: avg_val_loss differs after the resume"; fi
done

# ---- dropout: the masks follow the seed (the same run twice), a resume keeps them ----
$T --epochs 3 --dropout 0.3 --export "$tmp/d-a.safetensors" > "$tmp/d-a.out"
$T --epochs 3 --export "$tmp/d-0.safetensors" > /dev/null
$T --epochs 2 --dropout 0.3 --ckpt "$tmp/d.ckpt" > /dev/null
$T --epochs 3 --dropout 0.3 --ckpt "$tmp/d.ckpt" --resume --export "$tmp/d-b.safetensors" > /dev/null
if cmp -s "$tmp/d-a.safetensors" "$tmp/d-b.safetensors"; then ok; else bad "--dropout: the resumed run's weights differ"; fi
if ! cmp -s "$tmp/d-a.safetensors" "$tmp/d-0.safetensors"; then ok; else bad "--dropout 0.3 trains the same weights as none"; fi

# ---- the best epoch: exported, and its loss reproduced by predict; early stopping ----
$T --epochs 5 --lr 0.05 --keep-best --export "$tmp/best.safetensors" > "$tmp/best.out"
be=$(field "$tmp/best.out" best_epoch) bl=$(field "$tmp/best.out" best_val_loss)
if [ -n "$be" ] && [ "$be" -ge 1 ] && [ "$be" -le 5 ]; then ok; else bad "best_epoch '$be'"; fi
if grep -q "\"weights\":\"best epoch $be of 5" "$tmp/best.safetensors"; then ok; else bad "the file does not say best epoch $be"; fi
"$B/predict" --model "$tmp/best.safetensors" --data "$tmp/v.h5" --batch 32 --metrics --quiet > "$tmp/pred.out"
pl=$(sed -n 's/^metrics: .* val_loss=\([0-9.]*\) .*/\1/p' "$tmp/pred.out")
if [ -n "$pl" ] && [ "$pl" = "$bl" ]; then ok; else bad "predict --metrics val_loss '$pl', training's best_val_loss '$bl'"; fi
$T --epochs 30 --lr 0.2 --patience 1 > "$tmp/stop.out"
ep=$(field "$tmp/stop.out" epochs) be=$(field "$tmp/stop.out" best_epoch)
if [ -n "$ep" ] && [ "$ep" -lt 30 ] && [ "$ep" = $((be + 1)) ]; then ok
else bad "--patience 1: stopped after epoch '$ep' with the best at '$be'"; fi

# ---- walk-forward: deterministic, one file a fold with the fold's own normalisation ----
W="$T --epochs 1 --walk-forward 3"
$W --export "$tmp/wf.safetensors" > "$tmp/wf1.out"
$W > "$tmp/wf2.out"
if grep -q '^summary: folds=3 ' "$tmp/wf1.out" && [ "$(grep '^fold\|^summary' "$tmp/wf1.out")" = "$(grep '^fold\|^summary' "$tmp/wf2.out")" ]
then ok; else bad "walk-forward: no summary, or two runs differ"; fi
for k in 1 2 3; do [ -f "$tmp/wf.fold$k.safetensors" ] || bad "walk-forward: no wf.fold$k.safetensors"; done
m1=$(grep -a -o '"feature_mean":"[^"]*"' "$tmp/wf.fold1.safetensors") m3=$(grep -a -o '"feature_mean":"[^"]*"' "$tmp/wf.fold3.safetensors")
if [ -n "$m1" ] && [ "$m1" != "$m3" ]; then ok; else bad "walk-forward: the folds' normalisation is not their own"; fi
"$B/predict" --model "$tmp/wf.fold1.safetensors" --data "$tmp/v.h5" --metrics --quiet > "$tmp/wfp.out"
if grep -q '^metrics: rows=' "$tmp/wfp.out" && grep -q '^horizon 3: ' "$tmp/wfp.out"; then ok; else bad "predict --metrics on a fold's model"; fi

# ---- bad flags: one error line, exit 2, nothing written ----
for args in "--ema 1.5" "--ema 0" "--ema 1" "--swa-start 5 --epochs 4" "--swa-start 0" "--patience 0" \
            "--ema 0.9 --swa-start 1" "--dropout 1" "--walk-forward 1" "--walk-forward 40" "--wf-window 100" \
            "--walk-forward 2 --metrics $tmp/x.csv" "--walk-forward 2 --ckpt $tmp/x.ckpt"; do
    rc=0
    $T $args --export "$tmp/no.safetensors" --metrics "$tmp/no.csv" > "$tmp/err.out" 2> "$tmp/err.txt" || rc=$?
    lines=$(wc -l < "$tmp/err.txt")
    if [ "$rc" = 2 ] && [ "$lines" = 1 ] && grep -q '^error: ' "$tmp/err.txt" && [ ! -s "$tmp/err.out" ] &&
       [ ! -e "$tmp/no.safetensors" ] && [ ! -e "$tmp/no.csv" ]; then ok
    else bad "'$args': exit $rc, $lines lines: $(cat "$tmp/err.txt")"; fi
done

echo "select-cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
