"""An ordinary request through P and D, then one whose greedy first token on the tiny model
(make_model.py) is EOS, so P's one-token request ends "stopped" instead of "length capped". With
another model, any prompt whose greedy answer is EOS at once does the same.

    python repro.py --prefill URL --decode URL --bootstrap URL --abort-timeout-s 10
"""
import argparse
import sys
import time

from pd_client import MODEL, decode, engine_info, pd_request, post, prefill, result, text_of  # noqa: F401

# any text of about 200 tokens of the tiny model (each request its own: nothing comes from a cache)
WORDS = ("the quick brown fox jumps over the lazy dog while the prefill node sends blocks to the "
         "decode node and every request waits for its turn in the queue before it runs").split()


def prompt(i):
    return f"request {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(170))

# the greedy first token of this prompt on the tiny model is <|eos|>
EOS_PROMPT = "fault push day last under must near stop door stall day retry bandwidth kill a are stream small blue house among cat transfer east between and stall tiny latency house had scheduler fast prefill before of model can morning be scheduler first thousand output into push peer kill transfer cache been reply socket yellow chaos close window model between decode queue request can output head day small after bandwidth bandwidth tiny have was green stall light while tiny new prompt close small then start will been hundred leak socket one window cat to by layer week fire on while stream day"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", required=True)
    ap.add_argument("--decode", required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--abort-timeout-s", type=float, required=True)
    a = ap.parse_args()
    status, answer, took = pd_request(a.prefill, a.decode, a.bootstrap, prompt(1), 16, 60)
    if status != 200:
        print(f"error: an ordinary request through P and D answered {status}", file=sys.stderr)
        return 2
    print(f"an ordinary request through P and D: HTTP 200 in {took:.2f} s", flush=True)
    status, answer, took = pd_request(a.prefill, a.decode, a.bootstrap, EOS_PROMPT, 16, a.abort_timeout_s + 30)
    if status == 200:
        text = text_of(answer)
        return result(text != "", f"the EOS prompt answered HTTP 200 after {took:.2f} s with "
                                  f"{len(text or '')} characters (the correct answer is empty)")
    return result(True, f"the EOS prompt failed: HTTP {status} after {took:.2f} s (P's abort timeout: "
                        f"{a.abort_timeout_s:g} s)")


if __name__ == "__main__":
    sys.exit(main())
