#!/usr/bin/env bash
# The paper's sweep for GPT-3 175B; usage: scripts/gpt3.sh [MICRO_BATCH_SIZES] [phaze overrides...]
exec "$(dirname "$0")/sweep.sh" megatrongpt3 "$@"
