#!/bin/sh
# Issue 32's benchmark (docs/strategies.md, "Sparse rows"): a synthetic
# click-through set of ROWS records, 26 categorical features of 384,616 ids
# each (10^7 ids in all) and 13 numeric ones, a wide-deep model with
# embeddings of width 16 (a table of 640 MB), chief + 2 workers + 2 ps tasks
# through `downpour launch` under ps-async on sparse rows (each worker
# holding its tables compact).  Prints each figure beside its bound:
# each worker's peak resident memory (< 300 MB), the test log loss against
# the generating model's (within 2 %) and against the best a model of the
# training records can expect (docs/datasets.md), samples/s and a worker's bytes per
# step.  Not part of `make test`.
#
#   bench/ctr_sparse.sh [ROWS] [DIR]      (defaults: 20000000, /tmp/ctr-sparse)
#   EPOCHS, BATCH, LR, MODE (ps-async), DOWNPOUR_BIN (build/downpour)
set -eu
ROWS=${1:-20000000}
DIR=${2:-/tmp/ctr-sparse}
BIN=${DOWNPOUR_BIN:-build/downpour}
EPOCHS=${EPOCHS:-1}
BATCH=${BATCH:-256}
LR=${LR:-0.05}
MODE=${MODE:-ps-async}
PY=/usr/bin/python3
IDS=384616
TEST=$((ROWS / 20 < 200000 ? ROWS / 20 : 200000))
VAL=$((TEST / 2))
SET="$DIR/set-$ROWS"
mkdir -p "$DIR"
if [ ! -f "$SET/ctr-synth.json" ]; then
    "$BIN" data synth ctr --to "$SET" --rows "$ROWS" --test-rows "$TEST" --categorical 26 \
        --ids $IDS --numeric 13 --format npy --seed 7 >"$DIR/synth.log"
fi
MODEL=39
i=0
while [ $i -lt 26 ]; do MODEL="$MODEL-bag${IDS}x16"; i=$((i + 1)); done
MODEL="$MODEL-res(dense64-relu-dense32-relu-dense1|dense1)-bce"
METRICS="$DIR/metrics-$MODE-$ROWS.jsonl"
rm -f "$METRICS"
echo "ctr_sparse: $ROWS records (test $TEST, validation $VAL), 26 x $IDS ids x 16, $MODE," \
     "chief + 2 workers + 2 ps, batch $BATCH, adagrad lr $LR, $EPOCHS epoch(s); load:" \
     "$(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
start=$(date +%s)
"$BIN" launch --chief --workers 2 --ps 2 -- train --dataset "$SET" --model "$MODEL" \
    --strategy "$MODE" --epochs "$EPOCHS" --batch "$BATCH" --optimizer adagrad --lr "$LR" \
    --threads 1 --no-progress --log-every 0 --train-size $((ROWS - VAL)) --val-size "$VAL" \
    --stream on --data-memory 96M --metrics "$METRICS" --verbose >"$DIR/run.log" 2>&1 ||
    { tail -20 "$DIR/run.log"; exit 1; }
echo "wall: $(( $(date +%s) - start )) s (log: $DIR/run.log)"
grep -h "worker 0\] debug: \(compact tables\|sparse rows\)" "$DIR/run.log" | cut -c1-160
"$PY" - "$METRICS" "$SET/ctr-synth.json" <<'EOF'
import json, sys
peak, steps, done = {}, {}, None
for line in open(sys.argv[1]):
    j = json.loads(line)
    e, t = j.get("event"), j.get("task")
    if e == "resource":
        peak[t] = max(peak.get(t, 0), j["rss_bytes"])
    elif e == "steps":
        steps[t] = j
    elif e == "done":
        done = j
info = json.load(open(sys.argv[2]))["test"]
gen, seen = info["generating_log_loss"], info.get("seen_ids_log_loss")
bayes = info.get("bayes_estimate_log_loss")
mb = 1e6
for t in sorted(peak):
    bound = "  (bound < 300 MB: %s)" % ("ok" if peak[t] < 300 * mb else "OVER") \
        if t.startswith("worker") else ""
    print("peak RSS %-9s %8.1f MB%s" % (t, peak[t] / mb, bound))
if done:
    ll = done.get("test_log_loss")
    if ll is not None:
        print("test log loss %.5f, generating model %.5f: %+.2f %% (bound within 2 %%: %s)"
              % (ll, gen, 100 * (ll / gen - 1), "ok" if ll <= gen * 1.02 else "OVER"))
        if seen is not None: # docs/datasets.md: no learner can expect to do better
            print("  the best a model of these training records can expect: %.5f (%+.2f %% of "
                  "the generating model's); this run %+.2f %% of it"
                  % (seen, 100 * (seen / gen - 1), 100 * (ll / seen - 1)))
        if bayes is not None:
            print("  a Bayes learner's estimate: %.5f (%+.2f %% of the generating model's); "
                  "this run %+.2f %% of it" % (bayes, 100 * (bayes / gen - 1),
                                               100 * (ll / bayes - 1)))
    print("test AUC %s; samples/s %.0f (all workers, training time %.1f s)"
          % (done.get("test_auc"), done["samples_per_second"], done["train_seconds"]))
for t in sorted(steps):
    s = steps[t]
    if s["steps"]:
        print("%s: %.0f bytes a step sent + received (%d steps in its last steps event)"
              % (t, (s["comm_tx_bytes"] + s["comm_rx_bytes"]) / s["steps"], s["steps"]))
EOF
