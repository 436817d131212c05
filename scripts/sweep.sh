#!/usr/bin/env bash
# The paper's sweep for one model: every micro-batch size given (default [1,2,4,8]) at HBM 32, 64
# and 80 GiB, in one run_solver run (the layer schedules are shared across HBM sizes).
# usage: scripts/sweep.sh MODEL [MICRO_BATCH_SIZES] [phaze overrides...]
#   e.g. scripts/sweep.sh megatrongpt3 "[1,2]" search=phaze n_jobs=8
set -euo pipefail
model="$1"
micro_batch_sizes="${2:-[1,2,4,8]}"
shift $(( $# < 2 ? $# : 2 ))
exec phaze run_solver "model=${model}" "micro_batch_size=${micro_batch_sizes}" "hbm_size=[32,64,80]" "$@"
