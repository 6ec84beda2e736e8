#!/usr/bin/env bash
# The nightly CronJob's command: submit one sweep to the Ray cluster's job API and exit with its verdict.
#
#   submit.sh [--print] +sweep=NAME [orchestrator overrides ...]
#
# The Ray submission id and the orchestrator's sweep.id are both derived from the schedule slot (the UTC date),
# so a second firing in the same slot never starts a second sweep: Ray refuses a duplicate submission id, and
# this script then reports the outcome of the job that already has it. To retry a failed night, give a fresh
# SUBMISSION_ID with the same SWEEP_ID: the orchestrator resumes the sweep and skips its finished trials.
#
# The last line of output is one JSON object (job_summary.py) that an alert can parse; the exit code is the
# orchestrator's (0 ok, 1 failed trials, 2 bad input, 3 regression gate) or 4 when the job could not be
# submitted or followed.
#
# Environment (all optional):
#   RAY_DASHBOARD_URL  the head's job API            (default http://cp-ray-head-svc:8265)
#   RAY_AUTH_TOKEN     Ray's token (RAY_AUTH_MODE=token on the cluster); read by the ray CLI itself
#   SWEEP_SLOT         the schedule slot             (default: today's UTC date, YYYYMMDD)
#   SWEEP_ID           orchestrator sweep.id         (default: <sweep name with - for _>-<slot>)
#   SUBMISSION_ID      Ray submission id             (default: SWEEP_ID)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
print_only=0
if [[ ${1:-} == --print ]]; then
    print_only=1
    shift
fi
if (($# == 0)); then
    echo "usage: submit.sh [--print] +sweep=NAME [override ...]" >&2
    exit 2
fi

sweep_name=single
for arg in "$@"; do
    [[ $arg == +sweep=* ]] && sweep_name=${arg#+sweep=}
done
address=${RAY_DASHBOARD_URL:-http://cp-ray-head-svc:8265}
slot=${SWEEP_SLOT:-$(date -u +%Y%m%d)}
sweep_id=${SWEEP_ID:-${sweep_name//_/-}-$slot}
submission_id=${SUBMISSION_ID:-$sweep_id}

submit=(ray job submit --address "$address" --submission-id "$submission_id"
    -- python -m orchestrator "$@" "sweep.id=$sweep_id")
if ((print_only)); then
    echo "${submit[*]}"
    exit 0
fi

summary=(python "$here/job_summary.py" --address "$address" --submission-id "$submission_id" --sweep-id "$sweep_id")
state=$("${summary[@]}" --state)
case $state in
NONE)
    echo "submitting $submission_id: ${submit[*]}"
    # Its own exit code says only "failed" (1) or a lost log stream: the summary below reads the real one.
    "${submit[@]}" || true
    ;;
UNREACHABLE)
    export SUMMARY_MAX_ERRORS=1 # --state already waited for the head; report at once
    ;;
*)
    echo "submission $submission_id already exists ($state): not submitting again, reporting its outcome"
    ;;
esac
exec "${summary[@]}"
