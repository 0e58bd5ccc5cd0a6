"""The pull-request comment, in two halves that never share a trust level.

``python3 -m harness.ci.comment body --compare compare.json --out DIR ...`` runs in the pull-request
job (no secrets, read-only token): it writes ``DIR/comment.md`` (the comparison from ``pdchaos
compare --json-out``: verdict changes first, then latency ratios with the noise floor, with links
to the run and its artifact and the plot files in it; under 60 KB, GitHub's limit being 64 KB) and
``DIR/pr.json`` (the pull request's number and head commit), uploaded as the ``pr-comment`` artifact.
When there is no comparison (a step before it failed: ``--compare`` names a missing file), the
body says so for that head commit and names the steps that failed (``--steps``: the job's
``toJSON(steps)``), so the sticky comment never keeps showing an older commit's comparison.

``python3 -m harness.ci.comment failed --out DIR --pr N --head-sha SHA ...`` is that failure body
alone; the follow-up writes it itself when the pull-request job left no artifact at all (it failed
before it could write one) and the event names the pull request.

``python3 -m harness.ci.comment check --dir DIR --expect-sha SHA`` runs in the ``workflow_run``
follow-up, which may write comments: the artifact came from code of the pull request, so it is data
only: ``pr.json`` must hold a positive integer and the head commit the follow-up was started for,
and ``comment.md`` must be UTF-8 under 64 KB without the sticky marker of another tool; with
``--verify-api``, the pull request of that number must have that head commit, asked of the GitHub
API (``$GITHUB_API_URL``, ``$GITHUB_REPOSITORY``, token in ``$GITHUB_TOKEN``): a fork cannot point
the comment at another pull request. It sets the outputs ``number`` and ``path``. Exit 1 when any
of that does not hold.

Standard library only at import: the follow-up runs on a bare runner where only a Python
interpreter exists (tests/harness/test_workflows.py runs it in a venv without site packages);
``body`` imports the harness's reports (numpy) when it formats a comparison.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .gha import set_output

MARKER = "<!-- pd-chaos latency comparison -->"
COMMENT_LIMIT = 65536  # GitHub rejects a comment body longer than this (characters)


def plot_files(runs: list[Path], root: Path) -> list[str]:
    out = []
    for r in runs:
        if r.is_dir():
            out += sorted(str(p.relative_to(root)) for p in r.rglob("plots/*.png"))
    return out


def body(doc: dict, *, head_sha: str = "", base_sha: str = "", run_url: str = "", artifact_url: str = "",
         plots: list[str] | None = None, suites: str = "", max_bytes: int | None = None) -> str:
    from reports.compare import DEFAULT_MAX_BYTES, format_markdown

    max_bytes = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    header = [MARKER, "## pd-chaos: latency and verdicts, base vs head", ""]
    ctx = []
    if base_sha or head_sha:
        ctx.append(f"base `{base_sha[:12] or '?'}` → head `{head_sha[:12] or '?'}`")
    if suites:
        ctx.append(f"suites `{suites}`")
    if ctx:
        header += ["; ".join(ctx) + ".", ""]
    footer = [""]
    links = []
    if run_url:
        links.append(f"[workflow run]({run_url})")
    if artifact_url:
        links.append(f"[artifact: run folders, plots, compare.txt]({artifact_url})")
    if links:
        footer.append(" · ".join(links))
    if plots:
        shown = plots[:40]
        footer.append("")
        footer.append("<details><summary>Plots in the artifact (" + str(len(plots)) + ")</summary>")
        footer.append("")
        footer += [f"- `{p}`" for p in shown]
        if len(plots) > len(shown):
            footer.append(f"- … and {len(plots) - len(shown)} more")
        footer += ["", "</details>"]
    return format_markdown(doc, max_bytes=max_bytes, header="\n".join(header), footer="\n".join(footer))


def failed_steps(steps_json: str) -> list[str]:
    """The ids of the steps whose outcome was failure, from the job's ``toJSON(steps)``."""
    try:
        steps = json.loads(steps_json or "{}")
    except ValueError:
        return []
    if not isinstance(steps, dict):
        return []
    return [k for k, v in steps.items() if isinstance(v, dict) and v.get("outcome") == "failure"]


def failure_body(*, head_sha: str = "", base_sha: str = "", run_url: str = "", failed: list[str] | None = None,
                 suites: str = "", why: str = "") -> str:
    """The comment when there is no comparison for this head commit: it replaces the sticky comment
    of an older commit, so nobody reads that one as this commit's."""
    lines = [MARKER, "## pd-chaos: latency and verdicts, base vs head", "",
             f"**No comparison for head `{head_sha[:12] or '?'}`**"
             + (f" (base `{base_sha[:12]}`)" if base_sha else "") + ": the job ended before it could compare."]
    if failed:
        lines.append("Steps that failed: " + ", ".join(f"`{re.sub(r'[^A-Za-z0-9_.-]', '?', f)}`" for f in failed) + ".")
    if why:
        lines.append(why)
    if suites:
        lines.append(f"Suites `{suites}`.")
    if run_url:
        lines += ["", f"[workflow run]({run_url})"]
    return "\n".join(lines) + "\n"


def _valid_pr(pr: str) -> bool:
    if not re.fullmatch(r"[1-9][0-9]{0,9}", pr or ""):
        print(f"error: --pr {pr!r}: expected the pull request's number", file=sys.stderr)
        return False
    return True


def _write(out: Path, text: str, pr: str, head_sha: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / "comment.md").write_text(text, encoding="utf-8")
    (out / "pr.json").write_text(json.dumps({"number": int(pr), "head_sha": head_sha}) + "\n", encoding="utf-8")
    set_output("path", str(out / "comment.md"))
    set_output("bytes", len(text.encode("utf-8")))
    print(f"comment: {len(text.encode('utf-8'))} bytes -> {out / 'comment.md'}")
    return 0


def _failed_cmd(args: argparse.Namespace) -> int:
    if not _valid_pr(args.pr):
        return 2
    text = failure_body(head_sha=args.head_sha, base_sha=args.base_sha, run_url=args.run_url,
                        failed=failed_steps(args.steps), suites=args.suites, why=args.why)
    return _write(Path(args.out), text, args.pr, args.head_sha)


def _body_cmd(args: argparse.Namespace) -> int:
    if not _valid_pr(args.pr):
        return 2
    cmp = Path(args.compare)
    if not cmp.is_file():  # a step before the comparison failed: say so for this commit
        text = failure_body(head_sha=args.head_sha, base_sha=args.base_sha, run_url=args.run_url,
                            failed=failed_steps(args.steps), suites=args.suites)
        return _write(Path(args.out), text, args.pr, args.head_sha)
    doc = json.loads(cmp.read_text(encoding="utf-8"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = Path(args.plots_root)
    plots = plot_files([Path(p) for p in args.runs], root)
    text = body(doc, head_sha=args.head_sha, base_sha=args.base_sha, run_url=args.run_url,
                artifact_url=args.artifact_url, plots=plots, suites=args.suites)
    return _write(out, text, args.pr, args.head_sha)


def check(d: Path, expect_sha: str = "") -> tuple[int, Path]:
    """(pull request number, comment path) from an untrusted ``pr-comment`` artifact; ValueError."""
    try:
        meta = json.loads((d / "pr.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"pr.json: {exc}") from None
    number = meta.get("number") if isinstance(meta, dict) else None
    if not isinstance(number, int) or isinstance(number, bool) or not 0 < number < 10**10:
        raise ValueError(f"pr.json: \"number\": expected a positive integer, got {number!r}")
    sha = meta.get("head_sha")
    if expect_sha and sha != expect_sha:
        raise ValueError(f"pr.json: head_sha {sha!r} is not the commit this follow-up runs for ({expect_sha})")
    path = d / "comment.md"
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"comment.md: {exc}") from None
    if len(text) >= COMMENT_LIMIT or len(raw) >= COMMENT_LIMIT:
        raise ValueError(f"comment.md: {len(raw)} bytes, over GitHub's {COMMENT_LIMIT}")
    if not text.startswith(MARKER):
        raise ValueError("comment.md: does not start with the pd-chaos marker")
    if "<!-- Sticky Pull Request Comment" in text:
        raise ValueError("comment.md: holds another comment's sticky marker")
    return number, path


def _api_get(api: str, repo: str, path: str, token: str, timeout: float, what: str):
    """GET ``{api}/repos/{repo}/{path}`` of the GitHub REST API, decoded; ValueError naming ``what``."""
    import urllib.request

    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo or ""):
        raise ValueError(f"GITHUB_REPOSITORY {repo!r}: expected OWNER/NAME")
    req = urllib.request.Request(f"{api.rstrip('/')}/repos/{repo}/{path}",
                                 headers={"Accept": "application/vnd.github+json",
                                          "X-GitHub-Api-Version": "2022-11-28",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the API URL Actions gives
            return json.loads(resp.read().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{what}: the API did not answer: {exc}") from None


def pr_head_sha(number: int, api: str, repo: str, token: str, timeout: float = 20.0) -> str:
    """The head commit of pull request ``number``, from the GitHub REST API."""
    doc = _api_get(api, repo, f"pulls/{number}", token, timeout, f"pull request #{number}")
    sha = (doc.get("head") or {}).get("sha") if isinstance(doc, dict) else None
    if not isinstance(sha, str):
        raise ValueError(f"pull request #{number}: no head commit in the API's answer")
    return sha


def find_pr(head: str, sha: str, api: str, repo: str, token: str, timeout: float = 20.0) -> int:
    """The open pull request whose head is ``OWNER:BRANCH`` and at commit ``sha`` (a fork's
    ``workflow_run`` event names no pull request): asked of the GitHub REST API."""
    import urllib.parse

    if not re.fullmatch(r"[A-Za-z0-9_.-]+:[^\s:]+", head or ""):
        raise ValueError(f"--head {head!r}: expected OWNER:BRANCH")
    q = urllib.parse.urlencode({"head": head, "state": "open", "per_page": "100"})
    doc = _api_get(api, repo, f"pulls?{q}", token, timeout, f"pull requests of {head}")
    found = [pr.get("number") for pr in doc if isinstance(pr, dict) and (pr.get("head") or {}).get("sha") == sha] \
        if isinstance(doc, list) else []
    if len(found) != 1 or not isinstance(found[0], int):
        raise ValueError(f"no single open pull request from {head} at {sha[:12]} ({len(found)} found)")
    return found[0]


def _find_cmd(args: argparse.Namespace) -> int:
    import os

    try:
        number = find_pr(args.head, args.sha, os.environ.get("GITHUB_API_URL", "https://api.github.com"),
                         os.environ.get("GITHUB_REPOSITORY", ""), os.environ.get("GITHUB_TOKEN", ""))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(number)  # on stdout: the follow-up's script reads it
    return 0


def _check_cmd(args: argparse.Namespace) -> int:
    import os

    try:
        number, path = check(Path(args.dir), args.expect_sha)
        if args.verify_api:
            sha = pr_head_sha(number, os.environ.get("GITHUB_API_URL", "https://api.github.com"),
                              os.environ.get("GITHUB_REPOSITORY", ""), os.environ.get("GITHUB_TOKEN", ""))
            if sha != args.expect_sha:
                raise ValueError(f"pull request #{number} is at {sha}, not at {args.expect_sha}: not its comment")
    except ValueError as exc:
        print(f"error: the pr-comment artifact is not usable: {exc}", file=sys.stderr)
        return 1
    set_output("number", number)
    set_output("path", str(path))
    print(f"pull request #{number}: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m harness.ci.comment")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("body", help="write comment.md and pr.json (the pull-request job)")
    b.add_argument("--compare", required=True, help="the JSON `pdchaos compare --json-out` wrote")
    b.add_argument("--out", required=True, help="folder for comment.md and pr.json")
    b.add_argument("--pr", required=True, help="the pull request's number")
    b.add_argument("--head-sha", default="")
    b.add_argument("--base-sha", default="")
    b.add_argument("--run-url", default="")
    b.add_argument("--artifact-url", default="")
    b.add_argument("--suites", default="")
    b.add_argument("--runs", nargs="*", default=[], help="run folders whose plots the artifact holds")
    b.add_argument("--plots-root", default=".", help="plot paths are shown relative to this (the artifact's root)")
    b.add_argument("--steps", default="", help="the job's toJSON(steps): failed steps are named when there is no "
                                                "comparison")
    f = sub.add_parser("failed", help="write the no-comparison comment.md and pr.json")
    f.add_argument("--out", required=True)
    f.add_argument("--pr", required=True)
    f.add_argument("--head-sha", default="")
    f.add_argument("--base-sha", default="")
    f.add_argument("--run-url", default="")
    f.add_argument("--suites", default="")
    f.add_argument("--steps", default="")
    f.add_argument("--why", default="")
    c = sub.add_parser("check", help="check the pr-comment artifact (the workflow_run follow-up)")
    c.add_argument("--dir", required=True)
    c.add_argument("--expect-sha", default="")
    c.add_argument("--verify-api", action="store_true",
                   help="check with the GitHub API that the pull request's head is --expect-sha")
    fp = sub.add_parser("find-pr", help="the open pull request from OWNER:BRANCH at SHA (a fork's event names none)")
    fp.add_argument("--head", required=True)
    fp.add_argument("--sha", required=True)
    args = p.parse_args(argv)
    return {"body": _body_cmd, "failed": _failed_cmd, "check": _check_cmd, "find-pr": _find_cmd}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
