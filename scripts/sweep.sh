#!/usr/bin/env bash
# The paper's sweep for one model: every micro-batch size given (default [1,2,4,8]) at HBM 32, 64
# and 80 GiB, in one run_solver run (the layer schedules are shared across HBM sizes).
# usage: scripts/sweep.sh MODEL [MICRO_BATCH_SIZES] [phaze overrides...]
#   e.g. scripts/sweep.sh megatrongpt3 "[1,2]" search=phaze n_jobs=8
# Runs the project's .venv/bin/phaze (next to this script's directory, whatever the current
# directory) when it exists, else the phaze on PATH.
set -euo pipefail
if (( $# < 1 )); then
    echo "usage: $0 MODEL [MICRO_BATCH_SIZES] [phaze overrides...]" >&2
    exit 2
fi
model="$1"
micro_batch_sizes="${2:-[1,2,4,8]}"
shift $(( $# < 2 ? $# : 2 ))
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x "${root}/.venv/bin/phaze" ]]; then
    phaze="${root}/.venv/bin/phaze"
elif command -v phaze >/dev/null; then
    phaze="phaze"
else
    echo "$0: error: phaze: not in ${root}/.venv nor on PATH; run \`make install\` in ${root} first" >&2
    exit 2
fi
# the paper's HBM sizes, unless the system space sets each chip's HBM from its stacks
hbm_sizes=("hbm_size=[32,64,80]")
for argument in "$@"; do
    [[ "${argument}" == "architecture_space=system" ]] && hbm_sizes=()
done
exec "${phaze}" run_solver "model=${model}" "micro_batch_size=${micro_batch_sizes}" "${hbm_sizes[@]}" "$@"
