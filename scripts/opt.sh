#!/usr/bin/env bash
# The paper's sweep for OPT-350m; usage: scripts/opt.sh [MICRO_BATCH_SIZES] [phaze overrides...]
exec "$(dirname "$0")/sweep.sh" opt "$@"
