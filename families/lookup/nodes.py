"""The lookup family's node kinds (``pdchaos node KIND``), importable without loading the family."""

NODE_KINDS: dict[str, tuple[str, str]] = {
    "lookup-server": (f"{__package__}.server_node", "the hardened lookup server (worker rank 0)"),
    "legacy-server": (f"{__package__}.server_node", "a model of today's upstream lookup server"),
    "fake-peer": (f"{__package__}.fake_peer", "a misbehaving lookup peer: slow, silent, malformed, legacy"),
    "workload": (f"{__package__}.workload", "the scheduler side: runs lookups and records them"),
    "ascend-lookup-server": (f"{__package__}.ascend_server",
                             "worker rank 0's lookup server from real vllm-ascend code (conformance env)"),
    "ascend-workload": (f"{__package__}.ascend_workload",
                        "the workload with vllm-ascend's real scheduler-side client (conformance env)"),
    "store-lookup-server": (f"{__package__}.store_server",
                            "worker rank 0's admin-channel server of vLLM's store connector (P/D node env)"),
    "store-workload": (f"{__package__}.store_workload",
                       "the workload with vLLM's real store-connector client (P/D node env)"),
}
