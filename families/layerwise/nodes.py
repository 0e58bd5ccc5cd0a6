"""The layerwise family's node kinds (``pdchaos node KIND``), importable without loading the family."""

NODE_KINDS: dict[str, tuple[str, str]] = {
    "layerwise-decode": (f"{__package__}.node", "D: vllm-ascend's layerwise connector, scheduler and worker sides "
                                                "(conformance env)"),
    "layerwise-prefill": (f"{__package__}.node", "P: vllm-ascend's layerwise connector, worker side, over a fake "
                                                 "transfer engine (conformance env)"),
    "layerwise-metaserver": (f"{__package__}.metaserver", "the proxy's metaserver endpoint: D POSTs, it forwards to P"),
    "layerwise-workload": (f"{__package__}.workload", "requests through D, each until it leaves "
                                                      "WAITING_FOR_REMOTE_KVS"),
}
