"""Fault injection: the fault registry, fake peers, the interposer, process and network faults."""
