NODE_KINDS = {
    "echo-server": (f"{__package__}.server", "an echo server (REP): replies with what it got"),
    "echo-workload": (f"{__package__}.workload", "sends words and records each echo as an op"),
}
