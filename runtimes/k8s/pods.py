"""A node as a pod: the handle the topology, the faults and the checks hold (harness/runtime.py).

``instance`` is the pod's uid (a new one per start); ``alive`` is the pod running and not being
deleted (and its node not ended by a stop that keeps the pod); ``stop`` deletes the role's workload
(no replacement comes) and waits the pod out; ``kill`` deletes the pod at once (grace 0) and its
workload. Where peers name a node by its pod's own address (``cluster.peers: pod-ip``) a deleted
pod's address answers nothing at all (a blackhole, like a cut link), where a stopped process's port
on a host, or a Service left with no ready pod, refuses at once: there ``stop`` and ``kill`` end the
node's processes through exec (SIGTERM, SIGKILL after the grace; SIGKILL at once) and keep the pod,
so its ports refuse as a stopped node's do locally; the pod goes when its role starts again or with
the run's namespace (``keep_pod``). ``freeze``/``thaw`` run
``kill -STOP -1`` / ``kill -CONT -1`` in the container through exec (every process but the
container's first, the small shell that started the node: manifests.ENTRY), as NVIDIA Dynamo's
fault-tolerance suite stalls processes. Logs come from the API (the container's log).
"""

from __future__ import annotations

from typing import Any

from harness.errors import HarnessError
from harness.runtime import NodeHandle

from .client import Kube, KubeError
from .manifests import READY_FILE, STOPPED_FILE

STOP_TIMEOUT_S = 60.0
FREEZE_EXEC_S = 30.0  # one exec of freeze or thaw (a loaded machine's kubelet takes seconds)
# The node's processes in the container, counted with shell builtins only (no process of the
# counting shell's own is counted): every process but the first (the entry shell), this shell and
# its children, processes exec'd from outside (parent 0: another exec), and the entry shell's sleep
# once the node ended (manifests.ENTRY). Sets n.
NODE_PROCS = ('others() { n=0; for f in /proc/[0-9]*/stat; do p=${f#/proc/}; p=${p%/stat}; '
              '[ "$p" = 1 ] || [ "$p" = $$ ] && continue; read -r line 2>/dev/null < "$f" || continue; '
              'set -- ${line##*) }; [ "$2" = $$ ] || [ "$2" = 0 ] && continue; c=; '
              'read -r c 2>/dev/null < "/proc/$p/comm"; [ "$2" = 1 ] && [ "$c" = sleep ] && continue; '
              'n=$((n+1)); done; }; ')


def stop_script(grace_s: float) -> str:
    """End the node in its container and keep the pod: mark it stopped (manifests.STOPPED_FILE: the
    entry shell stays), not ready, SIGTERM to every process but the first, SIGKILL to what is left
    after ``grace_s`` (0: SIGKILL at once); prints how many of the node's processes are left."""
    steps = max(0, int(grace_s * 10))
    first = "KILL" if steps == 0 else "TERM"
    return (NODE_PROCS + f"touch {STOPPED_FILE} && rm -f {READY_FILE} || exit 1; kill -{first} -1 2>/dev/null; "
            f"i=0; others; while [ $n -gt 0 ] && [ $i -lt {steps} ]; do sleep 0.1; i=$((i+1)); others; done; "
            "kill -KILL -1 2>/dev/null; sleep 0.2; others; echo $n")


# whether a stop that keeps the pod took (an exec whose status the kubelet did not pass on may
# still have done its work): how many of the node's processes are left, -1 without the stopped mark
STOPPED_CHECK = NODE_PROCS + f"[ -e {STOPPED_FILE} ] || {{ echo -1; exit 0; }}; others; echo $n"


# how many processes of the container are stopped (state T), from /proc
STOPPED_COUNT = ("n=0; for f in /proc/[0-9]*/stat; do s=$(cut -d')' -f2 \"$f\" 2>/dev/null | cut -d' ' -f2); "
                 "[ \"$s\" = T ] && n=$((n+1)); done; echo \"$n\"")


def pod_ready(pod: dict) -> bool:
    st = pod.get("status") or {}
    if st.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])


def container_id(pod: dict, container: str) -> str | None:
    """The container's id as the kubelet reports it (``containerd://...``), or None."""
    for st in (pod.get("status") or {}).get("containerStatuses") or []:
        if st.get("name") == container:
            return st.get("containerID")
    return None


class PodHandle(NodeHandle):
    def __init__(self, kube: Kube, pod: dict, workload: dict, name: str, log_path: str | None = None,
                 container: str = "node", follow: bool = True, keep_pod: bool = False) -> None:
        self.kube, self.workload, self.name = kube, workload, name
        self.keep_pod = keep_pod  # stop and kill end the node's processes and keep the pod (its address)
        self.kept = False  # the node was ended that way: its pod is still there, not ready
        meta = pod["metadata"]
        self.pod_name, self.namespace, self._uid = meta["name"], meta["namespace"], meta["uid"]
        self.container = container
        self.container_id = container_id(pod, container)  # the journal records it (containerd://...)
        self.log_path = log_path
        self._ended = False
        self._saved = False
        self._followed: set[str] = set()  # container ids whose log the follower wrote
        if log_path and follow:
            import threading

            threading.Thread(target=self._follow, daemon=True, name=f"log-{self.pod_name}").start()

    def identity(self) -> dict:
        return {"pod": self.pod_name, "pod_uid": self._uid, "container_id": self.container_id}

    def _follow(self) -> None:
        """Stream the container's log into ``log_path`` as it is written, each container of the pod
        once (a container a fault killed and the kubelet restarted: the next one's too), so a pod
        that a fault deletes has left its log in the run folder already."""
        import time

        from kubernetes import client

        while not self._ended:
            pod = self._pod()
            cid = container_id(pod, self.container) if pod else None
            if pod is None:
                return
            if not cid or cid in self._followed:
                time.sleep(0.5)
                continue
            try:
                resp = client.CoreV1Api(self.kube.api).read_namespaced_pod_log(
                    self.pod_name, self.namespace, container=self.container, follow=True,
                    _preload_content=False, _request_timeout=(10, None))
            except Exception:  # noqa: BLE001 - no log served (a simulated node): save_log tries at the end
                return
            self._followed.add(cid)
            try:
                with open(self.log_path, "ab") as fh:
                    fh.write(f"# pd-chaos: pod {self.pod_name}, container {self.container} {cid}\n".encode())
                    for chunk in resp.stream(4096):
                        fh.write(chunk)
                        fh.flush()
            except Exception:  # noqa: BLE001 - the stream broke (the pod went): what came is written
                pass
            finally:
                resp.release_conn()

    @property
    def instance(self) -> str:
        return self._uid

    def _pod(self) -> dict | None:
        try:
            pod = self.kube.get("v1", "Pod", self.pod_name, self.namespace)
        except KubeError:
            return None  # the API server is gone: the node cannot be seen alive
        return pod if pod and pod["metadata"]["uid"] == self._uid else None

    @property
    def alive(self) -> bool:
        if self._ended or self.kept:
            return False
        pod = self._pod()
        return bool(pod) and (pod.get("status") or {}).get("phase") in ("Pending", "Running") \
            and not pod["metadata"].get("deletionTimestamp")

    def _delete_workload(self) -> None:
        w = self.workload
        self.kube.delete(w["apiVersion"], w["kind"], w["metadata"]["name"], w["metadata"]["namespace"])

    def _wait_gone(self, timeout_s: float) -> None:
        uid = self._uid
        self.kube.wait("v1", "Pod", self.namespace,
                       lambda items: not any(i["metadata"]["uid"] == uid for i in items),
                       timeout_s, f"pod {self.pod_name} gone")

    def _end(self, grace_s: int) -> None:
        """Delete the workload (no replacement comes) and the pod, and see it gone. Only then is the
        handle ended: a delete the API refused, or a pod that outlives the wait, leaves the handle
        asking the API, so ``alive`` stays true and a fault that meant to end it shows no effect."""
        self._save_log()
        try:
            self._delete_workload()
            self.kube.delete("v1", "Pod", self.pod_name, self.namespace, grace_s=grace_s)
            self._wait_gone(STOP_TIMEOUT_S)
        except KubeError:
            return  # never raises: the namespace's deletion at the end of the run removes what is left
        self._ended = True

    def _end_processes(self, grace_s: float) -> bool:
        """End the node's processes in its container and keep the pod (``keep_pod``); whether no
        process of the node was seen left after. Never raises: False sends the caller to deleting
        the pod, so the node is gone either way."""
        try:
            try:
                out = self._exec(stop_script(grace_s), FREEZE_EXEC_S + grace_s)
            except HarnessError:  # its status may be what was lost (a loaded kubelet): look again
                out = self._exec(STOPPED_CHECK, FREEZE_EXEC_S)
            left = int(out.strip().splitlines()[-1])
        except (HarnessError, ValueError, IndexError):
            return False
        if left != 0:
            return False
        self.kept = True
        return True

    def end_kept(self) -> None:
        """Delete the pod a stop kept (its role starts again, or the run ends): a no-op otherwise."""
        if self.kept and not self._ended:
            self._end(0)

    def stop(self, timeout_s: float = 5.0) -> int | None:
        if self._ended or self.kept:
            return None
        if self.keep_pod and self._end_processes(max(0.0, timeout_s)):
            return None
        self._end(max(0, int(timeout_s)))
        return None

    def kill(self) -> int | None:
        if self._ended or self.kept:
            return None
        if self.keep_pod and self._end_processes(0.0):
            return None
        self._end(0)
        return None

    def _read_log(self, previous: bool = False, limit_bytes: int | None = None) -> str | None:
        from kubernetes import client

        try:
            text = client.CoreV1Api(self.kube.api).read_namespaced_pod_log(
                self.pod_name, self.namespace, container=self.container, previous=previous,
                limit_bytes=limit_bytes, _request_timeout=30)
        except Exception:  # noqa: BLE001 - no log served (a simulated node, no earlier container, a pod gone)
            return None
        return text if isinstance(text, str) else None

    def save_log(self) -> None:
        """The container's log into the run folder (``log_path``), once: its earlier container's
        first (a container a fault killed and the kubelet restarted), then the current one's, so
        the checks that read every node's log (log_hygiene) read these too. Called before the pod
        goes and at the end of the run."""
        if not self.log_path or self._saved or self._followed:
            return  # written already, as it came (the follower)
        parts = [(label, self._read_log(previous=prev)) for label, prev in (("previous container", True),
                                                                            ("container", False))]
        parts = [(label, text) for label, text in parts if text]
        if not parts:
            return
        self._saved = True
        with open(self.log_path, "a", encoding="utf-8", errors="replace") as fh:
            for label, text in parts:
                fh.write(f"# pd-chaos: pod {self.pod_name}, {label} {self.container}\n")
                fh.write(text if text.endswith("\n") else text + "\n")

    _save_log = save_log

    def _exec(self, script: str, timeout_s: float = 15.0) -> str:
        """Run ``script`` in the node's container; its stdout (one error when it failed)."""
        return exec_in(self.kube, self.namespace, self.pod_name, self.container, ["sh", "-c", script],
                       f"{self.name}: exec in pod {self.pod_name}", timeout_s)

    def freeze(self) -> bool | None:
        # state T seen in /proc (no ps needed in a slim image); "?" when /proc cannot be read. An
        # exec whose status the kubelet did not pass on (seen on a loaded machine: "no exit status
        # from the kubelet") may still have stopped them: a second exec only counts, and says
        try:
            out = self._exec("kill -STOP -1; sleep 0.2; " + STOPPED_COUNT, FREEZE_EXEC_S)
        except HarnessError:
            out = self._exec(STOPPED_COUNT, FREEZE_EXEC_S)
        try:
            return int(out.strip().splitlines()[-1]) > 0
        except (ValueError, IndexError):
            return None

    def thaw(self) -> None:
        if not self.alive:  # nothing left to thaw (the pod is gone)
            return
        try:
            self._exec("kill -CONT -1", FREEZE_EXEC_S)
        except HarnessError:  # as for freeze: the status may be what was lost; SIGCONT twice is harmless
            self._exec("kill -CONT -1", FREEZE_EXEC_S)

    def proc_counts(self) -> dict | None:
        """Threads, open fds, processes and CPU seconds of every process in the container but the
        counting one, read from /proc through exec (python3 in the container: a serving image has
        it), and ``started``: when the container's first process started (clock ticks since boot: a
        container the kubelet started again has another); None when the exec fails (no python3,
        the pod gone)."""
        try:
            out = exec_in(self.kube, self.namespace, self.pod_name, self.container, ["python3", "-c", PROC_COUNTS],
                          f"{self.name}: process counts in pod {self.pod_name}", 15.0)
            vals = [float(x) for x in out.split()]
        except (HarnessError, ValueError):
            return None
        if len(vals) != 5:
            return None
        return {"threads": int(vals[0]), "fds": int(vals[1]), "processes": int(vals[2]), "cpu_s": round(vals[3], 3),
                "started": int(vals[4])}

    def log_tail(self, n_bytes: int = 2000) -> str:
        return self._read_log(limit_bytes=n_bytes) or ""


# every process of the container's pid namespace but this one: threads (stat field 20), fds,
# processes, utime + stime (fields 14, 15) in seconds, and the start time of its first process
# (field 22); one line "T F N CPU START"
PROC_COUNTS = (
    "import os\nt = f = n = 0\nc = 0.0\nhz = os.sysconf('SC_CLK_TCK')\nme = str(os.getpid())\n"
    "for p in os.listdir('/proc'):\n"
    "    if not p.isdigit() or p == me:\n        continue\n"
    "    try:\n"
    "        st = open('/proc/' + p + '/stat').read().rsplit(')', 1)[1].split()\n"
    "        k = len(os.listdir('/proc/' + p + '/fd'))\n"
    "    except OSError:\n        continue\n"
    "    t += int(st[17]); f += k; n += 1; c += (int(st[11]) + int(st[12])) / hz\n"
    "print(t, f, n, c, open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19])\n")


def exec_in(kube: Kube, namespace: str, pod: str, container: str, argv: list[str], what: str,
            timeout_s: float = 15.0) -> str:
    """Run ``argv`` in a pod's container; its stdout. The exec's status channel is read: a command
    that failed, or an exec the kubelet could not make, is one error, never an empty answer taken
    for success."""
    import json

    from kubernetes import client
    from kubernetes.stream import stream

    try:
        # an ApiClient of its own: stream() swaps the request method of the client it is given
        # while it connects (other threads' API calls on a shared one would go out as websockets)
        api = client.ApiClient(configuration=kube.api.configuration)
        ws = stream(client.CoreV1Api(api).connect_get_namespaced_pod_exec, pod, namespace, container=container,
                    command=argv, stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False,
                    _request_timeout=timeout_s)
        try:
            ws.run_forever(timeout=timeout_s)
            out, status = ws.read_stdout() or "", ws.read_channel(3) or ""
        finally:
            ws.close()
    except Exception as exc:  # noqa: BLE001 - one line: the pod cannot be exec'd into
        raise HarnessError(f"{what} failed: {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
    try:
        st = json.loads(status) if status else {}
    except ValueError:
        st = {}
    if st.get("status") != "Success":
        raise HarnessError(f"{what} failed: {(st.get('message') or 'no exit status from the kubelet')[:200]}")
    return out



class ExecSession:
    """A command kept running in a pod's container (an exec with its stdin open), spoken to line by
    line: :meth:`readline` (its stdout), :meth:`write` (its stdin), :meth:`close` (ends the exec:
    the command's stdin closes). Made for a process a fault starts before its window and only
    signals in it (``Placement.start_beside``)."""

    def __init__(self, kube: Kube, namespace: str, pod: str, container: str, argv: list[str], what: str,
                 timeout_s: float = 15.0) -> None:
        from kubernetes import client
        from kubernetes.stream import stream

        self.what = what
        try:
            # an ApiClient of its own, as exec_in's (stream() swaps the request method of its client)
            api = client.ApiClient(configuration=kube.api.configuration)
            self.ws = stream(client.CoreV1Api(api).connect_get_namespaced_pod_exec, pod, namespace,
                             container=container, command=argv, stderr=True, stdin=True, stdout=True, tty=False,
                             _preload_content=False, _request_timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - one line: the pod cannot be exec'd into
            raise HarnessError(f"{what} failed: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from None

    def readline(self, timeout_s: float) -> str:
        """The next line of the command's stdout (without its newline); HarnessError when the exec
        ended without one (its status and stderr named) or none came within ``timeout_s``."""
        import json
        import time

        end = time.monotonic() + timeout_s
        try:
            while True:
                # the client's own buffer, read here: its readline_stdout returns "" once the exec has
                # closed, even with the command's last line in that buffer
                chans = self.ws._channels  # noqa: SLF001
                buf = chans.get(1, "")
                if "\n" in buf:
                    line, rest = buf.split("\n", 1)
                    if rest:
                        chans[1] = rest
                    else:
                        del chans[1]
                    return line.rstrip("\r")
                left = end - time.monotonic()
                if not self.ws.is_open() or left <= 0:
                    break
                self.ws.update(timeout=min(left, 1.0))
        except Exception as exc:  # noqa: BLE001 - the stream broke: one line
            raise HarnessError(f"{self.what}: {type(exc).__name__}: {str(exc)[:200]}") from None
        if self.ws.is_open():
            raise HarnessError(f"{self.what}: no line from it within {timeout_s:g} s")
        try:
            st = json.loads(self.ws.read_channel(3) or "{}")
        except ValueError:
            st = {}
        err = (self.ws.read_channel(2) or "").strip().splitlines()
        said = st.get("message") or ("it exited 0" if st.get("status") == "Success" else "no exit status")
        raise HarnessError(f"{self.what}: ended without a line ({said[:200]})" + (f"; stderr: {err[-1][:200]}"
                                                                                     if err else ""))

    def write(self, line: str) -> None:
        try:
            self.ws.write_stdin(line + "\n")
        except Exception as exc:  # noqa: BLE001
            raise HarnessError(f"{self.what}: its stdin: {type(exc).__name__}: {str(exc)[:200]}") from None

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 - already closed by the other side
            pass


UNSCHEDULABLE_GRACE_S = 20.0
# waiting reasons that never end by themselves: the run fails at once, naming the pod and the reason
FATAL_WAITING = ("CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                 "CreateContainerConfigError", "CreateContainerError", "RunContainerError")


def stuck(pod: dict) -> str | None:
    """Why a pod will not become ready by itself (a container crash-looping, an image that cannot be
    pulled, a container that cannot be made), or None."""
    for st in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (st.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING:
            last = ((st.get("lastState") or {}).get("terminated") or {})
            exit_code = f"; its last run exited {last['exitCode']}" if "exitCode" in last else ""
            return (f"container {st.get('name')} is in {waiting['reason']}: "
                    f"{(waiting.get('message') or '').strip()[:200]}{exit_code}").rstrip(": ")
    return None


def ready_pod(kube: Kube, namespace: str, selector: str, timeout_s: float, what: str,
              not_uid: str | None = None, cancel: Any = None, pending_s: float | None = None) -> dict:
    """The first ready pod of ``selector`` (another than ``not_uid``), within ``timeout_s``. A pod
    that will not become ready by itself fails at once with its reason (:func:`stuck`); a pod the
    scheduler keeps refusing (a claim that does not exist, resources no node has) after a short
    grace; a pod still Pending after ``pending_s`` (unscheduled, its image not there) then too,
    not a wait to the deadline."""
    import time

    since: dict[str, float] = {}
    t0 = time.monotonic()

    def found(items: list[dict]) -> Any:
        for p in items:
            if p["metadata"]["uid"] == not_uid:
                continue
            if pod_ready(p):
                return p
            name = p["metadata"]["name"]
            why = stuck(p)
            if why:
                raise HarnessError(f"{what}: pod {name}: {why}")
            cond = next((c for c in (p.get("status") or {}).get("conditions") or []
                         if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
            if cond and cond.get("reason") == "Unschedulable":
                first = since.setdefault(p["metadata"]["uid"], time.monotonic())
                if time.monotonic() - first > UNSCHEDULABLE_GRACE_S:
                    raise HarnessError(f"{what}: pod {name} cannot be scheduled: "
                                       f"{(cond.get('message') or '')[:300]}")
            phase = (p.get("status") or {}).get("phase")
            if pending_s is not None and phase == "Pending" and time.monotonic() - t0 > pending_s:
                waiting = [((c.get("state") or {}).get("waiting") or {}).get("reason")
                           for c in (p.get("status") or {}).get("containerStatuses") or []]
                raise HarnessError(f"{what}: pod {name} still Pending after {pending_s:g} s "
                                   f"({', '.join(w for w in waiting if w) or (cond or {}).get('reason') or 'not started'})")
            if phase in ("Failed", "Succeeded"):
                raise HarnessError(f"{what}: pod {name} ended ({phase}) before it was ready")
        return None

    return kube.wait("v1", "Pod", namespace, found, timeout_s, what, selector=selector, cancel=cancel)
