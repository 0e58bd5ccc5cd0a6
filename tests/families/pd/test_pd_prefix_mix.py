"""The workload's shared-prefix mix (families/pd/workload.py, ``shared_prefix_tokens`` and
``prefix_groups``): prompts made with the tiny model's own tokenizer (its tokenizer.json, loaded by
the ``tokenizers`` library of the P/D node env and served as D's ``/tokenize`` answers it: the
token strings; the real D's /tokenize is exercised with vLLM in test_pd_nodes.py)."""

from __future__ import annotations

import subprocess
import textwrap
import time
from collections import Counter

import pytest

from families.pd.workload import make_prompts

pytestmark = pytest.mark.timeout(120)

SERVER = textwrap.dedent("""
    import json, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(sys.argv[1])
    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            enc = tok.encode(body["prompt"])
            out = json.dumps({"tokens": enc.ids, "token_strs": enc.tokens, "count": len(enc.ids)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
        def log_message(self, *a):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()
""")


@pytest.fixture(scope="module")
def tokenize_url():
    from stacks.vllm_cpu.recipe import pd_node_env
    from stacks.vllm_cpu.tiny_model import model_dir

    env, tok = pd_node_env(out=lambda s: None), model_dir() / "tokenizer.json"
    if not env.python.exists() or not tok.is_file():
        pytest.skip("the P/D node env or the tiny model is not set up (pdchaos setup)")
    proc = subprocess.Popen([str(env.python), "-c", SERVER, str(tok)], stdout=subprocess.PIPE, text=True)
    try:
        port = proc.stdout.readline().strip()
        assert port.isdigit(), "the tokenizer server did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


def _cfg(url: str, **extra) -> dict:
    return {"decode_url": url, "model": "tiny", "seed": 7, "prompt_tokens": 120, **extra}


def test_prompts_share_their_group_prefix_and_stay_unique(tokenize_url):
    prompts = make_prompts(_cfg(tokenize_url, shared_prefix_tokens=60, prefix_groups=3), 12,
                           time.monotonic() + 60)
    texts = [p for p, _ in prompts]
    assert len(set(texts)) == 12 and all(n <= 120 for _, n in prompts)
    groups = [texts[g::3] for g in range(3)]
    heads = []
    for members in groups:
        words = [t.split() for t in members]
        common = 0
        while all(len(w) > common for w in words) and len({w[common] for w in words}) == 1:
            common += 1
        assert common >= 20  # the prefix: whole words of about 60 tokens
        assert all(len(w) > common for w in words)  # and words of each prompt's own after it
        heads.append(" ".join(words[0][:common]))
    assert len(set(heads)) == 3  # three different prefixes


def test_without_a_mix_the_prompts_share_no_prefix(tokenize_url):
    prompts = make_prompts(_cfg(tokenize_url), 12, time.monotonic() + 60)
    firsts = Counter(" ".join(p.split()[:5]) for p, _ in prompts)
    assert len(firsts) == 12  # no two prompts start with the same five words


@pytest.mark.parametrize("extra,needle", [
    ("shared_prefix_tokens: 196", "at most prompt_tokens - 8"),
    ("prefix_groups: 2", "prefix_groups: needs shared_prefix_tokens"),
    ("shared_prefix_tokens: 64, prefix_groups: 9", "prefix_groups"),
])
def test_a_mix_that_cannot_be_made_is_one_clear_error(tmp_path, extra, needle):
    from harness.errors import UsageError
    from harness.schema import load_scenario

    path = tmp_path / "mix.yaml"
    path.write_text("name: mix\nfamily: pd\nseed: 1\ntargets: [hardened]\n"
                    f"workload: {{duration: 8s, prompt_tokens: 200, {extra}}}\n"
                    "triggers: {none: \"no fault\"}\nexpect: {hardened: pass}\n")
    with pytest.raises(UsageError, match=needle):
        load_scenario(path)
