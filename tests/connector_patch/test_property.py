"""Property: whatever frame list reaches a live LookupServer (random frames, or a valid request
mutated), it gets exactly one reply, that reply is a well-formed v1 envelope, and the server stays
alive and keeps answering a valid lookup correctly. Over real ipc and tcp sockets."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connector_patch.lookup import Code
from connector_patch.lookup.protocol import BACKEND_CODES, REQUEST_CODES, RESET_FRAME, decode_reply, encode_request
from rawpeers import PROMPT_S, counter_delta, distinct_hashes, hexes

pytestmark = [pytest.mark.usefixtures("log_guard"), pytest.mark.timeout(60)]

PROBE = distinct_hashes(4, "property-probe")
PROBE_FRAMES = encode_request(64, hexes(PROBE), (0,), 0)
KNOWN_CODES = REQUEST_CODES | BACKEND_CODES | {Code.INTERNAL}

# Bounded, and no per-example deadline: one example is a few socket round trips, which on two
# noisy shared cores can stall for a scheduler tick or two; the test's own timeout bounds the whole.
PROPERTY_SETTINGS = settings(
    max_examples=200,
    deadline=None,
    database=None,  # leave no .hypothesis folder behind in the repository
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@st.composite
def valid_requests(draw):
    n = draw(st.integers(0, 12))
    token_len = draw(st.integers(0, 300))
    hashes = [draw(st.binary(min_size=1, max_size=40)).hex() for _ in range(n)]
    groups = draw(st.sampled_from([[0], [1], [0, 1], [1, 0]]))
    hbm = draw(st.integers(0, token_len))
    return encode_request(token_len, hashes, groups, hbm)


@st.composite
def mutated_requests(draw):
    frames = list(draw(valid_requests()))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["replace", "truncate", "flip", "extend", "drop", "dup", "insert", "swap",
                                   "int_value", "msgpack_value"]))
        i = draw(st.integers(0, max(0, len(frames) - 1)))
        if not frames and op not in ("insert",):
            op = "insert"
        if op == "replace":
            frames[i] = draw(st.binary(max_size=32))
        elif op == "truncate":
            frames[i] = frames[i][: draw(st.integers(0, max(0, len(frames[i]) - 1)))]
        elif op == "flip" and frames[i]:
            j = draw(st.integers(0, len(frames[i]) - 1))
            frames[i] = frames[i][:j] + bytes([frames[i][j] ^ draw(st.integers(1, 255))]) + frames[i][j + 1:]
        elif op == "extend":
            frames[i] = frames[i] + draw(st.binary(min_size=1, max_size=8))
        elif op == "drop":
            del frames[i]
        elif op == "dup":
            frames.insert(i, frames[i])
        elif op == "insert":
            frames.insert(i, draw(st.binary(max_size=16)))
        elif op == "swap" and len(frames) > 1:
            j = draw(st.integers(0, len(frames) - 1))
            frames[i], frames[j] = frames[j], frames[i]
        elif op == "int_value":
            frames[i] = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "big")
        elif op == "msgpack_value":
            value = draw(st.recursive(
                st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=True)
                | st.text(max_size=20) | st.binary(max_size=10),
                lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                max_leaves=8))
            frames[i] = msgpack.packb(value, use_bin_type=True)
    return frames[:6]


frame_lists = st.one_of(
    st.lists(st.binary(max_size=48), min_size=0, max_size=6),  # random count 0..6, random bytes
    mutated_requests(),
    valid_requests(),
)


@PROPERTY_SETTINGS
@given(frames=frame_lists)
def test_every_frame_list_gets_exactly_one_envelope(frames, _prop_state):
    if frames == [RESET_FRAME]:  # the admin request is valid and would clear the probe's blocks
        frames = [RESET_FRAME + b"!"]
    state = _prop_state
    d = state["dealer"]
    if frames:
        d.send(frames)
        reply = d.recv(PROMPT_S)
        assert reply is not None, f"no reply to a {len(frames)}-frame request"
        env = decode_reply(reply, None)  # raises unless it is a well-formed v1 envelope
        assert env.ok or env.code in KNOWN_CODES
        state["sent"] += 1
    else:
        # A 0-frame request cannot be expressed in ZMQ (a message has >= 1 frame): the nearest thing,
        # a delimiter-only envelope, is dropped by libzmq's REP before the server sees it.
        d.send_envelope_only()
    # The server is alive and the next reply on this connection is the probe's own, correct one:
    # so the request above got exactly one reply (a second one would be read here instead).
    d.send(PROBE_FRAMES)
    probe = decode_reply(d.recv(PROMPT_S) or [], 64)
    assert probe.ok and probe.hit_tokens == 64
    state["sent"] += 1


@pytest.fixture
def _prop_state(shared_server, dealer_factory):
    """Per-test state shared by every example: one dealer, and the count of requests sent, which
    must equal the server's own request counter at the end."""
    shared_server.backend.put(hexes(PROBE))
    before = shared_server.server.counters
    state: dict = {"sent": 0, "dealer": dealer_factory(shared_server.endpoint)}
    yield state
    delta = counter_delta(before, shared_server.server.counters)
    assert delta.get("requests", 0) == state["sent"]
    assert state["sent"] >= 200  # every example ends with a probe answered correctly: alive throughout
