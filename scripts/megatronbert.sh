#!/usr/bin/env bash
# The paper's sweep for Megatron BERT; usage: scripts/megatronbert.sh [MICRO_BATCH_SIZES] [phaze overrides...]
exec "$(dirname "$0")/sweep.sh" megatronbert "$@"
