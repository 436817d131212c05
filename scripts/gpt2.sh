#!/usr/bin/env bash
# The paper's sweep for GPT-2 XL; usage: scripts/gpt2.sh [MICRO_BATCH_SIZES] [phaze overrides...]
exec "$(dirname "$0")/sweep.sh" gpt2 "$@"
