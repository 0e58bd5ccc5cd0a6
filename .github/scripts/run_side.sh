#!/usr/bin/env bash
# One side (base or head) of the pull-request comparison, run from that side's checkout:
#   RUN_ARGS="scenarios/lookup/ --target hardened" BENCH_N=400 OUT=/path run_side.sh head
# Runs `pdchaos run` with the side's own code into $OUT/runs/<side>/, never fails the step (the
# Verdict step decides), and sets the step outputs rc (pdchaos run's exit code) and run_dir.
set -uo pipefail
side="$1"
: "${OUT:?OUT: where run folders go}" "${RUN_ARGS:?RUN_ARGS: the suites to run}" "${GITHUB_OUTPUT:=/dev/stdout}"
read -ra run_args <<< "$RUN_ARGS"
bench_args=()
if [ "${BENCH_N:-0}" -gt 0 ]; then
  bench_args=(--bench "$BENCH_N")
fi
python3 -m harness.cli run "${run_args[@]}" "${bench_args[@]}" --plain --runs-dir "$OUT/runs/$side"
rc=$?
run_dir=""
for d in "$OUT/runs/$side"/*/; do
  [ -f "$d/summary.json" ] && run_dir="${d%/}"
done
echo "$side: pdchaos run exit $rc, run folder ${run_dir:-none}"
{
  echo "rc=$rc"
  echo "run_dir=$run_dir"
} >> "$GITHUB_OUTPUT"
exit 0
