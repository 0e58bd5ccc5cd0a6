#!/usr/bin/env bash
# docs/reports/<scenario>--upstream/: the issue-ready report of each upstream defect, from a real run.
# Usage: harness/scripts/refresh-upstream-reports.sh SCENARIO...   (names as in the diffs' Scenarios: headers)
# Each scenario runs once on the upstream target through `pdchaos repro` (real nodes, 15 min at most);
# its README.md, scenario.yaml, journal excerpt, plots and standalone/ folder are copied here (the run folder and report.html
# are not: they hold every process's log, megabytes, and stay in the repro folder under $TMPDIR).
# Then `pdchaos docs` links each report from docs/scenarios/upstream-diffs.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp="$(mktemp -d "${TMPDIR:-/tmp}/pdchaos-reports-XXXXXX")"
rc=0
for sc in "$@"; do
  out="$tmp/$sc"
  if timeout 900 python3 -m harness.cli repro "$sc" --target upstream --out "$out" > "$tmp/$sc.log" 2>&1; then
    echo "$sc: $(tail -1 "$tmp/$sc.log")"
  else
    echo "$sc: pdchaos repro failed (exit $?): see $tmp/$sc.log" >&2
    rc=1
    continue
  fi
  dst="docs/reports/$sc--upstream"
  rm -rf "$dst" && mkdir -p "$dst"
  cp "$out/README.md" "$out/scenario.yaml" "$out/journal-excerpt.jsonl" "$dst/"
  [ -d "$out/plots" ] && cp -r "$out/plots" "$dst/"
  [ -d "$out/standalone" ] && cp -r "$out/standalone" "$dst/" && rm -rf "$dst/standalone/out" "$dst/standalone/model"
done
python3 -m harness.cli docs
exit "$rc"
