#!/usr/bin/env bash
# Text of variable length (docs/benchmarks.md): the BERT example through a real TorchServe,
# ours (length order + token budget) vs ours in arrival order vs upstream's MicroBatching on
# the same handler stages vs the plain handler, on three corpora made in tokens.
#
#   benchmarks/text_lengths.sh [RUN_DIR]          # make bench-text; ~30 min on 2 cores
#
# Env: PY (python), MAR (default model_store/bert_mb.mar, built if missing), ROUNDS (3),
# LOCK (a file: every TorchServe run is taken under `flock $LOCK`), RESULTS (where the
# summary goes; default benchmarks/results/text_lengths).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MAR=${MAR:-model_store/bert_mb.mar}
ROUNDS=${ROUNDS:-3}
RUN=${1:-benchmarks/runs/text-lengths-$(date +%Y%m%d-%H%M%S)}
RESULTS=${RESULTS:-benchmarks/results/text_lengths}
TOKENIZER=build/bert_mb/model
locked() { if [ -n "${LOCK:-}" ]; then flock "$LOCK" "$@"; else "$@"; fi; }

if [ ! -f "$MAR" ] || [ ! -d "$TOKENIZER" ]; then
  HF_HUB_OFFLINE=1 "$PY" examples/bert_classifier/build_mar.py --export-path "$(dirname "$MAR")" \
    --model-name "$(basename "$MAR" .mar)" --model-config examples/bert_classifier/model-config.yaml
fi
mkdir -p "$RUN"

# 1. Corpora, lengths in the example tokenizer's tokens ([CLS] and [SEP] included).
"$PY" benchmarks/make_text_corpus.py --tokenizer "$TOKENIZER" --count 400 \
  --mix "70:8-64,25:65-256,5:257-512" --out "$RUN/corpora/long_tail"
"$PY" benchmarks/make_text_corpus.py --tokenizer "$TOKENIZER" --count 400 --seed 1 \
  --mix "100:8-64" --out "$RUN/corpora/short"
"$PY" benchmarks/make_text_corpus.py --tokenizer "$TOKENIZER" --count 400 --seed 2 \
  --mix "100:257-512" --out "$RUN/corpora/long"

AB=("$PY" benchmarks/benchmark-ab.py --max-batch-delay 50 --warmup-requests 100)

# 2. A short sweep of our length settings on the long-tailed mix at batch 32, one round;
#    the fastest becomes "ours" for every corpus (a .mar with it, $RUN/bert_ours.mar).
locked "${AB[@]}" --mar "$MAR" --corpus "$RUN/corpora/long_tail" --no-baseline \
  --batch-size 32 --concurrency 64 --requests 400 --rounds 1 --out "$RUN/sweep" \
  --variant 'budget1024={"max_micro_batch_tokens": 1024}' \
  --variant 'budget4096={"max_micro_batch_tokens": 4096}' \
  --variant 'auto={"micro_batch_size": "auto", "max_micro_batch_tokens": null}'
"$PY" benchmarks/text_lengths.py pick "$RUN/sweep" --mar "$MAR" --out "$RUN/bert_ours.mar"

# 3. The comparison. Upstream and ours in arrival order cut micro-batches of 4 (and 8 at
#    batch 32 on the mix) with threads 1/1/1, as ours does.
STAGES='"parallelism": {"preprocess": 1, "inference": 1, "postprocess": 1}'
UPSTREAM=benchmarks/handlers/upstream_bert_handler.py
variants() {  # micro-batch sizes...
  for n in "$@"; do
    echo --handler-variant "upstream$n=$UPSTREAM:{\"enabled\": false, \"micro_batch_size\": $n, $STAGES}"
    echo --variant "arrival$n={\"order\": \"arrival\", \"max_micro_batch_tokens\": null, \"micro_batch_size\": $n, $STAGES}"
  done
}
run() {  # NAME CORPUS BATCH CONCURRENCY REQUESTS SIZES...
  local name=$1 corpus=$2 batch=$3 clients=$4 requests=$5
  shift 5
  local extra=()
  while IFS= read -r line; do extra+=("${line%% *}" "${line#* }"); done < <(variants "$@")
  locked "${AB[@]}" --mar "$RUN/bert_ours.mar" --corpus "$RUN/corpora/$corpus" \
    --baseline-handler benchmarks/handlers/plain_bert_handler.py "${extra[@]}" \
    --batch-size "$batch" --concurrency "$clients" --requests "$requests" --rounds "$ROUNDS" \
    --out "$RUN/$name"
}
run long_tail-b32 long_tail 32 64 500 4 8
run long_tail-b16 long_tail 16 32 400 4
run short-b32 short 32 64 600 4
run long-b32 long 32 64 300 4
# The uniform corpora again, with the example's default budget (2048) beside the pick.
for spec in "short 600" "long 300"; do
  set -- $spec
  locked "${AB[@]}" --mar "$RUN/bert_ours.mar" --corpus "$RUN/corpora/$1" \
    --baseline-handler benchmarks/handlers/plain_bert_handler.py \
    --handler-variant "upstream4=$UPSTREAM:{\"enabled\": false, \"micro_batch_size\": 4, $STAGES}" \
    --variant 'budget2048={"max_micro_batch_tokens": 2048}' \
    --batch-size 32 --concurrency 64 --requests "$2" --rounds "$ROUNDS" --out "$RUN/$1-b32-budget2048"
done

# 4. Medians, per-round ratios, the plot and the tables.
"$PY" benchmarks/text_lengths.py report "$RUN" --out "$RESULTS"
