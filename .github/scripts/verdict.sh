#!/usr/bin/env bash
# The pull-request comparison's verdict: fail when the head's run deviated (exit != 0) or
# `pdchaos compare` found a regression (1) or could not compare (2, or never ran: empty).
# The base's exit code is shown only: a deviation already on the base is not this PR's.
set -u
echo "base run: exit ${BASE_RC:-none} (shown only); head run: exit ${HEAD_RC:-none}; compare: exit ${COMPARE_RC:-none}"
if [ "${HEAD_RC:-}" != 0 ]; then
  echo "::error::the head's pdchaos run did not end as expected (exit ${HEAD_RC:-none}): see the head summary"
  exit 1
fi
if [ "${COMPARE_RC:-}" != 0 ]; then
  echo "::error::pdchaos compare: exit ${COMPARE_RC:-none} (1: a regression over the threshold; 2 or none: no comparison)"
  exit 1
fi
echo "no deviation on the head, no regression over the threshold"
