#!/usr/bin/env bash
# The paper's sweep for Llama-2 7B; usage: scripts/llama2.sh [MICRO_BATCH_SIZES] [phaze overrides...]
exec "$(dirname "$0")/sweep.sh" llama2 "$@"
