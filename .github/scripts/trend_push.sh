#!/usr/bin/env bash
# The nightly's bench trend, kept durably on a data branch of the repository (not in the actions
# cache, which evicts entries and is per branch):
#   BENCH=run/bench.json SUITE_ID=lookup COMMIT=sha REPO_URL=https://github.com/o/r \
#   REMOTE=https://x-access-token:TOKEN@github.com/o/r.git BRANCH=pdchaos-bench-data trend_push.sh OUT_DIR
# Fetches the branch (or starts it, orphan), appends this run's figures to <suite>/data.js
# (github-action-benchmark's layout, harness.ci.trend), commits and pushes; a push refused because
# another suite's job pushed first is fetched, rebased (each suite has its own file) and tried again,
# 5 times at most. Leaves the updated data.js in OUT_DIR. Exit non-zero when it could not push.
set -euo pipefail
out="$1"
: "${BENCH:?}" "${SUITE_ID:?}" "${COMMIT:?}" "${REMOTE:?}" "${BRANCH:=pdchaos-bench-data}" "${REPO_URL:=}"
here="$(pwd)"
work="$(mktemp -d "${RUNNER_TEMP:-/tmp}/pdchaos-trend.XXXXXX")"
trap 'rm -rf "$work"' EXIT
git -C "$work" init -q
git -C "$work" config user.name "pd-chaos nightly"
git -C "$work" config user.email "pd-chaos-nightly@users.noreply.github.com"
git -C "$work" remote add origin "$REMOTE"
for try in 1 2 3 4 5; do
  if git -C "$work" fetch -q --depth=1 origin "$BRANCH" 2>/dev/null; then
    git -C "$work" checkout -q -B "$BRANCH" FETCH_HEAD
  else
    git -C "$work" checkout -q --orphan "start-$try"  # the branch's first commit
  fi
  (cd "$here" && python3 -m harness.ci.trend --bench "$BENCH" --data "$work/$SUITE_ID/data.js" \
    --name "pd-chaos nightly: $SUITE_ID" --commit "$COMMIT" --repo-url "$REPO_URL")
  git -C "$work" add "$SUITE_ID/data.js"
  git -C "$work" commit -q -m "bench trend: $SUITE_ID at ${COMMIT:0:12}"
  if git -C "$work" push -q origin "HEAD:refs/heads/$BRANCH" 2>/dev/null; then
    mkdir -p "$out"
    cp "$work/$SUITE_ID/data.js" "$out/data.js"
    echo "bench trend: $SUITE_ID pushed to $BRANCH (try $try)"
    exit 0
  fi
  echo "bench trend: push refused (another job pushed first?), try $try of 5"
  git -C "$work" reset -q --hard
  sleep "$try"
done
echo "::error::bench trend: could not push to $BRANCH"
exit 1
