#!/usr/bin/env bash
# The paper's sweep for Megatron GPT-2, 8.3B shape; usage: scripts/megatrongpt2.sh [MICRO_BATCH_SIZES] [phaze overrides...]
exec "$(dirname "$0")/sweep.sh" megatrongpt2-72 "$@"
