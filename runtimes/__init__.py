"""Node runtimes: where a node runs and how faults and checks reach it (harness/runtime.py).

Each runtime is one folder with everything specific to it, as a family is: ``local`` (processes
on this machine, today's behaviour) and ``k8s`` (pods through the Kubernetes API, Chaos Mesh for
the faults it has). The core loads them by name (builtin here, or the ``pdchaos.runtimes`` entry
point group) and never names one.
"""
