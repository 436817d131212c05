#!/usr/bin/env bash
# The paper's sweep for BERT-Large; usage: scripts/bert.sh [MICRO_BATCH_SIZES] [phaze overrides...]
exec "$(dirname "$0")/sweep.sh" bertlarge "$@"
