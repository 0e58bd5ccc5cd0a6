"""The pd family's node kinds (``pdchaos node KIND``), importable without loading the family."""

NODE_KINDS: dict[str, tuple[str, str]] = {
    "vllm": (f"{__package__}.vllm_node", "one vLLM server (prefill or decode) from the node env, with a control channel"),
    "pd-proxy": (f"{__package__}.proxy", "the P/D proxy: vLLM's Mooncake P/D protocol, bounded errors, phase hooks"),
    "pd-fake-prefill": (f"{__package__}.fake_prefill",
                        "a fake prefill peer for D: Mooncake bootstrap /query + side channel, answering by --mode"),
    "pd-workload": (f"{__package__}.workload", "completions through the proxy, each recorded as an op"),
    "mooncake-master": (f"{__package__}.store_master",
                        "a real Mooncake store master (mooncake_master) on loopback, for AscendStore's KV pool"),
}
