#!/usr/bin/env bash
# One explore job of the CPU nightly (schedule_nightly_cpu.yaml), from its environment:
#   TARGET=hardened|upstream BUDGET=20m SEED=N RUNS_DIR=path nightly_explore.sh
# hardened: a finding fails the job (its shrunk reproduction is in the artifact);
# upstream, the control: finding nothing fails the job (the known upstream failures must show,
# else explore has gone blind). An interrupted or broken exploration fails either way.
set -uo pipefail
: "${TARGET:?TARGET: hardened or upstream}" "${BUDGET:?BUDGET: e.g. 20m}" "${SEED:?SEED: an integer}" \
  "${RUNS_DIR:?RUNS_DIR: where the run folder goes}"
mkdir -p "$RUNS_DIR"
python3 -m harness.cli explore --family pd --target "$TARGET" --budget "$BUDGET" --seed "$SEED" \
  --runs-dir "$RUNS_DIR"
rc=$?
case "$TARGET:$rc" in
  hardened:0) echo "explore $TARGET: no finding"; exit 0 ;;
  hardened:1) echo "::error::explore found schedules hardened does not pass: see the reproductions in the artifact"; exit 1 ;;
  upstream:1) echo "explore $TARGET (the control): found the upstream failures it must find"; exit 0 ;;
  upstream:0) echo "::error::explore on upstream (the control) found nothing: it has gone blind"; exit 1 ;;
  *) echo "::error::explore $TARGET ended with exit $rc (not a verdict)"; exit "$(( rc == 0 ? 1 : rc ))" ;;
esac
