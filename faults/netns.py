"""Isolated hosts on one Linux machine: two network namespaces joined by a veth pair (needs root).

::

    with NetnsPair() as net:                 # pdc-<hex>-a, pdc-<hex>-b, a random private /30
        server = net.popen("b", [sys.executable, "server.py", net.ip_b])
        net.run("a", ["ping", "-c1", net.ip_b])
        rules = net.partition("a->b", "drop")   # iptables in b: packets from a vanish
        net.heal(rules)
        net.set_bandwidth("a->b", rate_kbit=8000)  # tc tbf on a's end of the veth

Everything lives inside the two namespaces the pair creates: the addresses (a /30 drawn at random
from 10.0.0.0/8 or 172.16.0.0/12, avoiding the host's own subnets), the iptables rules and the
qdiscs. Nothing is changed in the host's namespace. ``cleanup()`` kills the processes started in
the namespaces and deletes both (which deletes the veth); it runs on ``__exit__``, at interpreter
exit (atexit) for pairs still alive, and is idempotent. A process killed outright (SIGKILL) runs
none of that: each namespace has an owner record (``OWNERS_DIR``), and :func:`sweep_stale`
removes the namespaces whose owner is gone (the next run does, and ``pdchaos doctor``).

Directions: "a->b" stops packets sent by a to b (the rule sits in b's INPUT chain, as Jepsen
does on the receiving node); "b->a" the reverse; "both" both. Modes: "drop" (packets vanish: the
sender times out) and "reject" (TCP answered with a reset, i.e. connection refused; other
protocols with ICMP port-unreachable).

Nothing here runs at import time; :func:`install_iptables` is for the setup script.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import threading
import weakref
from typing import Literal, Sequence

Side = Literal["a", "b"]
Direction = Literal["a->b", "b->a", "both"]
Mode = Literal["drop", "reject"]

CHAIN = "PDC-FAULTS"
CMD_TIMEOUT_S = 10.0

# --------------------------------------------------------------------------- availability


class NetnsError(RuntimeError):
    """A namespace operation failed; the message names the command and its stderr."""


def _run(argv: Sequence[str], *, timeout: float = CMD_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise NetnsError(f"{argv[0]}: not found") from None
    except subprocess.TimeoutExpired:
        raise NetnsError(f"{' '.join(argv[:6])}: no answer within {timeout:g}s") from None
    if check and res.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: exit {res.returncode}: {(res.stderr or res.stdout).strip()[:300]}")
    return res


def is_root() -> bool:
    return os.geteuid() == 0


def tools() -> dict[str, str | None]:
    """Path of each tool the isolated hosts need (None when absent)."""
    return {name: shutil.which(name) for name in ("ip", "iptables", "tc")}


def availability() -> tuple[bool, str]:
    """(True, "") when root, ip, iptables and tc are present; else (False, what is missing)."""
    missing = []
    if not is_root():
        missing.append("root (isolated hosts need CAP_NET_ADMIN; run as root)")
    for name, path in tools().items():
        if path is None:
            hint = " (apt-get install iptables)" if name == "iptables" else " (apt-get install iproute2)"
            missing.append(f"{name}{hint}")
    if missing:
        return False, "missing: " + ", ".join(missing)
    return True, ""


def install_iptables() -> tuple[bool, str]:
    """Install iptables with apt-get when it is missing and we are root. For the setup script only."""
    if shutil.which("iptables"):
        return True, "iptables already installed"
    if not is_root():
        return False, "iptables missing and not root: cannot install it"
    if not shutil.which("apt-get"):
        return False, "iptables missing and no apt-get: install it with the system package manager"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "iptables"]):
        res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            return False, f"{' '.join(argv)} failed: {res.stderr.strip()[-300:]}"
    if not shutil.which("iptables"):
        return False, "apt-get installed iptables but it is not on PATH"
    return True, "iptables installed with apt-get"


def netns_supported() -> tuple[bool, str]:
    """Try to create and delete a namespace."""
    ok, why = availability_ip_root()
    if not ok:
        return False, why
    name = f"pdc-probe-{secrets.token_hex(3)}"
    try:
        _run(["ip", "netns", "add", name])
    except NetnsError as exc:
        return False, f"cannot create a network namespace: {exc}"
    try:
        _run(["ip", "netns", "del", name])
    except NetnsError as exc:
        return False, f"created {name} but cannot delete it: {exc}"
    return True, "created and deleted a namespace"


def availability_ip_root() -> tuple[bool, str]:
    if not is_root():
        return False, "not root"
    if shutil.which("ip") is None:
        return False, "ip (iproute2) missing"
    return True, ""


def qdisc_available(kind: str) -> tuple[bool, str]:
    """Whether the kernel has the ``kind`` qdisc ("netem", "tbf"): tried on lo of a throwaway namespace.
    netem is not built into every kernel; faults that need it are skipped with this reason."""
    ok, why = availability_ip_root()
    if not ok:
        return False, why
    if shutil.which("tc") is None:
        return False, "tc (iproute2) missing"
    args = {"netem": ["delay", "1ms"], "tbf": ["rate", "1mbit", "burst", "32kb", "latency", "50ms"]}[kind]
    name = f"pdc-probe-{secrets.token_hex(3)}"
    try:
        _run(["ip", "netns", "add", name])
    except NetnsError as exc:
        return False, f"cannot create a network namespace: {exc}"
    try:
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        res = _run(["tc", "-n", name, "qdisc", "add", "dev", "lo", "root", kind, *args], check=False)
        if res.returncode != 0:
            return False, f"{kind} qdisc not available in this kernel: {res.stderr.strip()[:200]}"
        return True, f"{kind} qdisc available"
    finally:
        _run(["ip", "netns", "del", name], check=False)


def netem_available() -> tuple[bool, str]:
    return qdisc_available("netem")


def list_namespaces(prefix: str = "pdc-") -> list[str]:
    res = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.split() and line.startswith(prefix)]


# --------------------------------------------------------------------------- owners
# Each namespace a pair makes has an owner record (the making process's pid and start time), written
# before the namespace exists and removed after it is gone: a run killed with SIGKILL leaves its
# namespaces (and the iptables rules and qdiscs inside them) behind, and :func:`sweep_stale` tells
# them from a live run's by their owner. A namespace without a record (made by an older pd-chaos, or
# by hand) is never removed automatically, only named.

OWNERS_DIR = "/run/pdchaos/netns"
OWNERS_ENV = "PDCHAOS_NETNS_OWNERS"  # another folder (tests: a sweep of their own that no other run's sweep sees)


def owners_dir() -> str:
    return os.environ.get(OWNERS_ENV) or OWNERS_DIR


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22); None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _write_owner(ns: str) -> None:
    os.makedirs(owners_dir(), exist_ok=True)
    with open(os.path.join(owners_dir(), ns), "w", encoding="ascii") as fh:
        fh.write(f"{os.getpid()} {_start_time(os.getpid()) or '?'}\n")


def _drop_owner(ns: str) -> None:
    try:
        os.unlink(os.path.join(owners_dir(), ns))
    except OSError:
        pass


def owner_alive(ns: str) -> bool | None:
    """Whether the process that made ``ns`` still runs (the same process: pid and start time);
    None when ``ns`` has no owner record."""
    try:
        with open(os.path.join(owners_dir(), ns), encoding="ascii") as fh:
            pid, started = fh.read().split()[:2]
    except (OSError, ValueError):
        return None
    return pid.isdigit() and _start_time(int(pid)) == started


def sweep_stale(prefix: str = "pdc-") -> tuple[list[str], list[str]]:
    """Remove the namespaces (``prefix``...) whose owner is dead: the processes still inside are
    killed, the namespace deleted (its veth, iptables rules and qdiscs go with it), its record
    too. Returns (removed, of unknown owner: left alone). Needs root and ``ip``; quiet without."""
    if not is_root() or shutil.which("ip") is None:
        return [], []
    removed, unknown = [], []
    present = list_namespaces(prefix)
    for ns in present:
        alive = owner_alive(ns)
        if alive is None:
            unknown.append(ns)
            continue
        if alive:
            continue
        res = _run(["ip", "netns", "pids", ns], check=False)
        for pid in (int(p) for p in res.stdout.split() if p.isdigit()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if _run(["ip", "netns", "del", ns], check=False).returncode == 0:
            removed.append(ns)
            _drop_owner(ns)
    try:  # records of namespaces that are gone (a run killed between its record and `ip netns add`)
        for ns in os.listdir(owners_dir()):
            if ns.startswith(prefix) and ns not in present and owner_alive(ns) is False:
                _drop_owner(ns)
    except OSError:
        pass
    return removed, unknown


# --------------------------------------------------------------------------- the pair

_LIVE: "weakref.WeakSet[NetnsPair]" = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def _cleanup_all() -> None:
    with _LIVE_LOCK:
        pairs = list(_LIVE)
    for pair in pairs:
        try:
            pair.cleanup()
        except Exception:
            pass


atexit.register(_cleanup_all)


def _host_networks() -> list[ipaddress.IPv4Network]:
    """Subnets the host already uses (addresses and routes of its namespace), to stay clear of them."""
    nets: list[ipaddress.IPv4Network] = []
    for argv in (["ip", "-o", "-4", "addr", "show"], ["ip", "-4", "route", "show"]):
        res = _run(argv, check=False)
        for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", res.stdout):
            try:
                nets.append(ipaddress.ip_network(token, strict=False))
            except ValueError:
                continue
    return nets


def pick_subnet(rng: random.Random | None = None, avoid: Sequence[ipaddress.IPv4Network] = ()) -> ipaddress.IPv4Network:
    """A random /30 in 10.0.0.0/8 or 172.16.0.0/12 that overlaps none of ``avoid``."""
    rng = rng or random.SystemRandom()
    pools = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("172.16.0.0/12")]
    for _ in range(1000):
        pool = rng.choice(pools)
        index = rng.randrange(pool.num_addresses // 4)
        net = ipaddress.ip_network(f"{pool.network_address + index * 4}/30")
        if not any(net.overlaps(other) for other in avoid):
            return net
    raise NetnsError("no free private /30 found")


class NetnsPair:
    """Two namespaces ``a`` and ``b`` with a veth between them: ``ip_a`` <-> ``ip_b`` (a /30)."""

    def __init__(self, prefix: str = "pdc"):
        tag = secrets.token_hex(3)
        self.ns = {"a": f"{prefix}-{tag}-a", "b": f"{prefix}-{tag}-b"}
        self.veth = {"a": f"{prefix}{tag}a", "b": f"{prefix}{tag}b"}  # <= 15 chars (IFNAMSIZ)
        self.subnet: ipaddress.IPv4Network | None = None
        self.ip: dict[str, str] = {}
        self._procs: list[subprocess.Popen] = []
        self._created: list[str] = []
        self._chains: set[str] = set()
        self._rules: list[tuple[str, list[str]]] = []
        self._qdiscs: set[str] = set()
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ names
    @property
    def a(self) -> str:
        return self.ns["a"]

    @property
    def b(self) -> str:
        return self.ns["b"]

    @property
    def ip_a(self) -> str:
        return self.ip["a"]

    @property
    def ip_b(self) -> str:
        return self.ip["b"]

    @staticmethod
    def other(side: Side) -> Side:
        return "b" if side == "a" else "a"

    # ------------------------------------------------------------------ lifecycle
    def create(self) -> "NetnsPair":
        ok, why = availability_ip_root()
        if not ok:
            raise NetnsError(f"isolated hosts: {why}")
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            for side in ("a", "b"):
                _write_owner(self.ns[side])  # first: a run killed next leaves nothing without an owner
                _run(["ip", "netns", "add", self.ns[side]])
                self._created.append(self.ns[side])
            self.subnet = pick_subnet(avoid=_host_networks())
            hosts = list(self.subnet.hosts())
            self.ip = {"a": str(hosts[0]), "b": str(hosts[1])}
            # Created straight inside the namespaces: the host's namespace never sees the veth.
            _run(["ip", "link", "add", self.veth["a"], "netns", self.a, "type", "veth",
                  "peer", "name", self.veth["b"], "netns", self.b])
            for side in ("a", "b"):
                ns = self.ns[side]
                _run(["ip", "-n", ns, "addr", "add", f"{self.ip[side]}/30", "dev", self.veth[side]])
                _run(["ip", "-n", ns, "link", "set", self.veth[side], "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        except BaseException:
            self.cleanup()
            raise
        return self

    def cleanup(self) -> None:
        """Kill what runs in the namespaces, delete them (and with them the veth). Idempotent."""
        with self._lock:
            for proc in self._procs:
                _stop_process(proc)
            self._procs.clear()
            for ns in list(self._created):
                # Processes still inside (e.g. children of ours that left our process group): they
                # are in a namespace this pair made, so they are ours to end.
                res = _run(["ip", "netns", "pids", ns], check=False)
                for pid in (int(p) for p in res.stdout.split() if p.isdigit()):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                _run(["ip", "netns", "del", ns], check=False)
                _drop_owner(ns)
                self._created.remove(ns)
            for ns in self.ns.values():  # also the record of one `ip netns add` never made
                _drop_owner(ns)
            self._rules.clear()
            self._chains.clear()
            self._qdiscs.clear()
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def __enter__(self) -> "NetnsPair":
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def exists(self) -> bool:
        names = set(list_namespaces(""))
        return self.a in names or self.b in names

    # ------------------------------------------------------------------ commands inside
    def argv(self, side: Side, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns[side], *argv]

    def run(self, side: Side, argv: Sequence[str], *, timeout: float = CMD_TIMEOUT_S,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run a command inside a namespace and wait for it (bounded)."""
        return _run(self.argv(side, argv), timeout=timeout, check=check)

    def popen(self, side: Side, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start a process inside a namespace, in its own process group; ``cleanup()`` stops it."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(self.argv(side, argv), start_new_session=True, **kwargs)
        with self._lock:
            self._procs.append(proc)
        return proc

    # ------------------------------------------------------------------ partitions
    def _iptables(self, side: Side, args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
        if shutil.which("iptables") is None:
            raise NetnsError("iptables missing (apt-get install iptables)")
        return self.run(side, ["iptables", "-w", "5", *args], check=check)

    def _ensure_chain(self, side: Side) -> None:
        if side in self._chains:
            return
        self._iptables(side, ["-N", CHAIN])
        self._iptables(side, ["-I", "INPUT", "1", "-j", CHAIN])
        self._chains.add(side)

    def partition(self, direction: Direction = "both", mode: Mode = "drop",
                  tag: str | None = None, ports: Sequence[int] = (),
                  port_side: Side = "b") -> list[tuple[str, list[str]]]:
        """Cut the link; returns the rules added (give them to :meth:`heal` to remove just these).
        ``tag`` (letters, digits, ``-``) marks each rule with an iptables comment, so that
        :meth:`stopped` can count the packets these rules stopped. ``ports``: cut only the TCP
        traffic of these ports of ``port_side`` (packets sent to them, and packets sent from
        them, as ``direction`` says); every other port keeps working."""
        if tag is not None and not re.fullmatch(r"[A-Za-z0-9-]{1,40}", tag):
            raise ValueError(f"tag: {tag!r}: letters, digits and '-' only (at most 40)")
        if direction not in ("a->b", "b->a", "both"):
            raise ValueError(f"direction: {direction!r}: expected 'a->b', 'b->a' or 'both'")
        if mode not in ("drop", "reject"):
            raise ValueError(f"mode: {mode!r}: expected 'drop' or 'reject'")
        if port_side not in ("a", "b"):
            raise ValueError(f"port_side: {port_side!r}: expected 'a' or 'b'")
        ports = list(ports)
        for port in ports:
            if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
                raise ValueError(f"ports: {port!r}: expected a TCP port number (1-65535)")
        senders: list[Side] = ["a", "b"] if direction == "both" else [direction[0]]  # type: ignore[list-item]
        added: list[tuple[str, list[str]]] = []
        with self._lock:
            for sender in senders:
                receiver = self.other(sender)
                self._ensure_chain(receiver)
                src = ["-s", self.ip[sender]]
                if ports:
                    # to port_side's ports from the other side, from them back: TCP of those ports only
                    which = "--dport" if sender != port_side else "--sport"
                    verdict = ["DROP"] if mode == "drop" else ["REJECT", "--reject-with", "tcp-reset"]
                    specs = [[*src, "-p", "tcp", which, str(port), "-j", *verdict] for port in ports]
                    if mode == "reject":  # a refusal of the other side's rule coming back passes (as below)
                        specs.insert(0, [*src, "-p", "tcp", "--tcp-flags", "RST", "RST", "-j", "RETURN"])
                elif mode == "drop":
                    specs = [[*src, "-j", "DROP"]]
                else:
                    # Refusals coming back (a RST, an ICMP unreachable) pass: with "both", the other
                    # side's REJECT rule would otherwise swallow them and a refusal become a timeout.
                    specs = [[*src, "-p", "tcp", "--tcp-flags", "RST", "RST", "-j", "RETURN"],
                             [*src, "-p", "icmp", "--icmp-type", "destination-unreachable", "-j", "RETURN"],
                             [*src, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
                             [*src, "-j", "REJECT", "--reject-with", "icmp-port-unreachable"]]
                for spec in specs:
                    if tag is not None:  # after "-s ADDR": every spec starts with it
                        spec = [*spec[:2], "-m", "comment", "--comment", tag, *spec[2:]]
                    self._iptables(receiver, ["-A", CHAIN, *spec])
                    added.append((receiver, spec))
                    self._rules.append((receiver, spec))
        return added

    def heal(self, rules: list[tuple[str, list[str]]] | None = None) -> None:
        """Remove the given rules (default: every rule this pair added). Idempotent."""
        with self._lock:
            targets = list(self._rules) if rules is None else list(rules)
            for side, spec in targets:
                if (side, spec) not in self._rules:
                    continue
                self._iptables(side, ["-D", CHAIN, *spec], check=False)
                self._rules.remove((side, spec))

    def stopped(self, tag: str) -> int:
        """How many packets the DROP and REJECT rules marked with ``tag`` stopped, over both
        namespaces (their iptables counters; the RETURN rules that let refusals through are not
        counted). -1 when a counter cannot be read."""
        total = 0
        with self._lock:
            for side in sorted(self._chains):
                out = self._iptables(side, ["-L", CHAIN, "-v", "-x", "-n"], check=False)
                if out.returncode != 0:
                    return -1
                for line in out.stdout.splitlines():
                    cols = line.split()
                    if f"/* {tag} */" in line and len(cols) > 2 and cols[0].isdigit() and cols[2] in ("DROP", "REJECT"):
                        total += int(cols[0])
        return total

    def rules(self, side: Side) -> list[str]:
        """The rules of our chain in a namespace, as ``iptables -S`` prints them."""
        if side not in self._chains:
            return []
        out = self._iptables(side, ["-S", CHAIN]).stdout.splitlines()
        return [line for line in out if line.startswith("-A ")]

    # ------------------------------------------------------------------ bandwidth
    def set_bandwidth(self, direction: Direction, rate_kbit: int, *, burst_bytes: int = 16384,
                      latency_ms: int = 50) -> None:
        """tc tbf on the sender's end of the veth: at most ``rate_kbit`` kbit/s from that side."""
        if rate_kbit <= 0 or burst_bytes <= 0 or latency_ms <= 0:
            raise ValueError("rate_kbit, burst_bytes and latency_ms must be > 0")
        senders: list[Side] = ["a", "b"] if direction == "both" else [direction[0]]  # type: ignore[list-item]
        with self._lock:
            for side in senders:
                _run(["tc", "-n", self.ns[side], "qdisc", "replace", "dev", self.veth[side], "root", "tbf",
                      "rate", f"{int(rate_kbit)}kbit", "burst", str(int(burst_bytes)), "latency", f"{int(latency_ms)}ms"])
                self._qdiscs.add(side)

    def clear_bandwidth(self, direction: Direction = "both") -> None:
        senders: list[Side] = ["a", "b"] if direction == "both" else [direction[0]]  # type: ignore[list-item]
        with self._lock:
            for side in senders:
                if side in self._qdiscs:
                    _run(["tc", "-n", self.ns[side], "qdisc", "del", "dev", self.veth[side], "root"], check=False)
                    self._qdiscs.discard(side)


def _stop_process(proc: subprocess.Popen, grace: float = 2.0) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m faults.netns install-iptables | check``: for setup scripts (.ci/run, README)."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["install-iptables"]:
        ok, why = install_iptables()
    elif args == ["check"]:
        ok, why = availability()
        why = why or "root, ip, iptables and tc present"
    else:
        print("usage: python -m faults.netns install-iptables | check", file=sys.stderr)
        return 2
    print(f"netns: {why}")
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
