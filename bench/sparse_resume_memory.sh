#!/bin/sh
# The peak resident memory of each task of a run on sparse rows with
# --keep-best and a checkpoint, and of the same run --resume'd from that
# checkpoint (docs/checkpoints.md, "Reading in pieces"; docs/benchmarks.md):
# a table of 2^22 x 16 floats (256 MiB) over 2 ps tasks, adagrad, chief +
# 2 workers, ps-async, one epoch of 500 records (the resumed run starts at
# the end: its tasks read the checkpoint, evaluate and save).  Prints each
# task's rss_hwm_bytes from its last `resource` event.  Not part of `make
# test` (tests/test_ps_sparse_ctr.c bounds the same figures).
#
#   bench/sparse_resume_memory.sh [DIR]     (default /tmp/sparse-resume-memory)
#   DOWNPOUR_BIN (build/downpour)
set -eu
DIR=${1:-/tmp/sparse-resume-memory}
BIN=${DOWNPOUR_BIN:-build/downpour}
mkdir -p "$DIR"
rm -rf "$DIR/ck" "$DIR/a.jsonl" "$DIR/b.jsonl"
if [ ! -f "$DIR/big/ctr-synth.json" ]; then
    "$BIN" data synth ctr --to "$DIR/big" --rows 600 --test-rows 100 --categorical 1 \
        --ids 4194304 --numeric 2 >/dev/null
fi
ARGS="--dataset $DIR/big --model 3-bag4194304x16-dense1-bce --strategy ps-async --epochs 1
  --threads 1 --no-progress --log-every 0 --train-size 500 --val-size 100 --batch 32
  --optimizer adagrad --lr 0.05 --keep-best --checkpoint-dir $DIR/ck"
# shellcheck disable=SC2086
"$BIN" launch --chief --workers 2 --ps 2 -- train $ARGS --metrics "$DIR/a.jsonl" \
    --save "$DIR/a.st" 2>"$DIR/a.log"
# shellcheck disable=SC2086
"$BIN" launch --chief --workers 2 --ps 2 -- train $ARGS --metrics "$DIR/b.jsonl" --resume \
    --save "$DIR/b.st" 2>"$DIR/b.log"
for run in a b; do
    /usr/bin/python3 - "$DIR/$run.jsonl" "$run" <<'PY'
import json, sys
last = {}
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("event") == "resource":
        last[e.get("task")] = e["rss_hwm_bytes"]
what = "--keep-best, a checkpoint, --save" if sys.argv[2] == "a" else "--resume'd from it"
print(what + ": " + ", ".join("%s %.1f MiB" % (t, b / 1048576) for t, b in sorted(last.items())))
PY
done
rm -rf "$DIR/ck" "$DIR/a.st" "$DIR/b.st"
