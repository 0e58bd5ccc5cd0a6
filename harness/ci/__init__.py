"""What pd-chaos's GitHub Actions workflows run (``.github/workflows/``), as small commands that the
tests run offline: ``python3 -m harness.ci.<module> ...``.

- ``gha``: writing ``$GITHUB_OUTPUT``, ``$GITHUB_STEP_SUMMARY``, ``$GITHUB_ENV`` (the workflow-commands files).
- ``suites``: which scenario suites a filter input selects, as a job matrix.
- ``install``: the pip installs of a profile (``cpu``; ``ascend``: vLLM with ``VLLM_TARGET_DEVICE=empty``,
  vllm-ascend from source, mooncake-transfer-engine-npu pinned); ``--dry-run`` prints them.
- ``step_summary``: a run folder's ``summary.md`` into the job summary, its counts as step outputs.
- ``comment``: the pull-request comment body (under 64 KB) and, in the ``workflow_run`` follow-up,
  the check of what the untrusted pull-request job handed over.
- ``trend``: the bench trend file (github-action-benchmark's ``data.js`` layout).

Standard library only (plus the harness's own reports for ``step_summary``): these run before and
after the harness's dependencies are installed.
"""
