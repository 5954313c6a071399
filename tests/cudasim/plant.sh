#!/bin/sh
# The planted faults of tests/cudasim/neg.sh in real library sites: copies of the headers and of
# the example's sources in which each site below can be taken out at run time
# (CUDASIM_PLANT=name: cudasim::planted): a line removed, or an expression replaced, as the fault
# would be written; everything else is the library's own code. One build serves every site.
# Each site must be found exactly once, or this fails: a site that moved is updated here, never
# dropped in silence.   plant.sh OUTDIR
set -eu
out=$1
rm -rf "$out"
mkdir -p "$out/examples"
cp megabatch.h megabatch_cuda.cuh "$out/"
cp examples/*.h examples/*.c examples/*.cu "$out/examples/"

# site NAME FILE ANCHOR OLD [NEW]: in FILE, the first line after the (one) line containing ANCHOR
# that contains OLD; without NEW that line (a statement) is skipped when the site is planted,
# with NEW the text OLD in it becomes NEW.
site() {
    f="$out/$2"
    awk -v name="$1" -v anchor="$3" -v old="$4" -v new="${5-}" -v repl="${5+1}" '
        index($0, anchor) { anchors++; armed = anchors == 1 }
        armed && !done && (i = index($0, old)) {
            if (repl) $0 = substr($0, 1, i - 1) "(cudasim::planted(\"" name "\") ? " new " : " old ")" substr($0, i + length(old))
            else { match($0, /^[ \t]*/); $0 = substr($0, 1, RLENGTH) "if (!cudasim::planted(\"" name "\")) " substr($0, RLENGTH + 1) }
            done = 1
        }
        { print }
        END {
            if (anchors != 1 || !done) {
                printf "plant.sh: site %s: anchor \"%s\" found %d time(s), \"%s\" after it: %s\n", name, anchor, anchors,
                       old, done ? "yes" : "no" > "/dev/stderr"
                exit 1
            }
        }' "$f" >"$f.new"
    mv "$f.new" "$f"
}

# the loader's copy stream no longer waits for compute before loading the next chunk into a
# buffer compute may still read (a write after read)
site loader_kick megabatch.h 'static mb_result mb__ld_kick(' 'MB_TRY(mb_stream_wait(ld->dev, MB_STREAM_COPY, MB_STREAM_COMPUTE));'
# the reader fills a pinned slab without waiting for the copy out of it (a slab reused too early)
site slab_reuse megabatch.h 'static mb_result mb__ld_load(mb_loader' 'MB_TRY(mb_sync(dev, MB_STREAM_COPY)); /* the copy out of slab s'
# a meter read counted as landed without its event (the host reads pinned memory being written)
site meter_landed megabatch.h 'MBDEF mb_result mb_meter_next(mb_meter *m, int wait, int *landed) {' 'if (!done) return MB_OK;'
# the LSTMs of mb_lstm_*_many start without waiting for the compute stream (kernels read what
# kernels of another stream wrote)
site lstm_fork megabatch.h 'static mb_result mb__lstm_many_begin(' 'for (int i = 0; i < n; i++) MB_TRY(mb_stream_wait(dev, calls[i].lstm->cfg.stream, MB_STREAM_COMPUTE));'
# ... and compute does not join their streams back (a capture with unjoined work)
site lstm_join megabatch.h 'static mb_result mb__lstm_many_end(' 'mb_stream_wait(calls[0].lstm->dev, MB_STREAM_COMPUTE, calls[i].lstm->cfg.stream)' MB_OK
# AdamW's decay mask in malloc'ed memory, which its kernel reads (a host pointer in a launch)
site host_mask megabatch.h 'static mb_result mb__adamw_decay_mask(' MB_MEM_DEVICE MB_MEM_HOST
# the carried state copied into a checkpoint without waiting for the encoder's stream
site carry_ckpt examples/multitf.h 'MTF_API mb_result mtf_model_save_carry(' 'MB_TRY(mb_stream_wait(m->dev, MB_STREAM_COMPUTE, MTF_STREAM(s)));'
