"""``pdchaos setup --only k8s-node``: what a REAL single-node cluster on this machine needs (a kubelet
running pods under containerd, and Chaos Mesh's own controller and daemon), idempotently.

It is an **optional** step (``optional = True``, harness/setup.py): ``pdchaos setup --all`` only
checks it and reports ``optional, not selected``, because ``--all`` must stay within 8 minutes on a
fresh machine and the Go builds here alone take ~15 min cold on 2 cores. Ask for it by name.

What it installs or builds, into ``${PDCHAOS_K8S_HOME:-~/.cache/pdchaos/k8s}/node-<TAG>/``:

* Debian packages (apt-get, as root): containerd, runc, containernetworking-plugins (``/usr/lib/cni``),
  iptables, ipset, busybox-static;
* the ``k8s`` step's control plane (runtimes/k8s/stack.py), when it is not there yet;
* ``bin/kubelet`` v1.34.4, built from a copy of the ``k8s.io/kubernetes`` module (the module cache is
  read-only, and ``go build -overlay`` refuses files in it) in which one line is changed: the kubelet
  only *warns* about kernel tunables (``KernelTunableWarn``) where it would otherwise write host
  sysctls (``vm.overcommit_memory``, ``kernel.panic``, ...). The staging modules are pinned to v0.34.4
  and the version set with ``-ldflags -X`` as for the control plane;
* ``bin/chaos-controller-manager`` (CGO off) and ``bin/chaos-daemon`` (CGO on; its fakeclock ``.o``
  files are compiled with ``cc`` first and embedded) from a copy of Chaos Mesh at the ``k8s`` stack's
  pin, with its ``api`` module replaced by the nearest pseudo-version the Go proxy serves
  (``CHAOS_MESH_API``: the proxy refuses the one at Chaos Mesh's own commit);
* ``crds/chaos-mesh-crd.yaml``: the pinned CRDs with ``spec.partitionBehavior`` added wherever a
  NetworkChaos spec is (that api version has the field and defaults it; a CRD without it prunes it,
  and the webhook then answers "Cannot update chaos spec");
* ``daemon-bin/nsexec``: a STAND-IN for Chaos Mesh's ``nsexec`` helper (a release download that
  cannot be had here) over util-linux ``nsenter``; and ``daemon-bin/pause``;
* ``images/pause.tar`` (a tiny static C program: the pods' sandbox) and ``images/host-usr.tar`` (an
  empty root file system whose /bin, /sbin, /lib, /lib64 point into /usr: a pod mounts the host's
  /usr read-only and runs the host's programs), both OCI image archives made here, imported into
  containerd with ``ctr images import`` when a cluster starts (no registry is reachable).

Go runs under ``nice -n 19``, in a work folder at a fixed path (``<k8s home>/.node-build``, removed
afterwards) so that Go's build cache serves a rebuild. Measured on 2 cores (cold Go caches):
kubelet ~80 s once the control plane is built, chaos-controller-manager ~8 min, chaos-daemon ~4 min.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

from harness.setup import APT_INSTALL_TIMEOUT_S, APT_UPDATE_TIMEOUT_S, StepFailed

from . import stack
from .stack import CHAOS_MESH, KUBERNETES, STAGING

# ----------------------------------------------------------------------------- the pins (one place)
CHAOS_MESH_API = "v0.0.0-20260906172039-d70b66ad97ac"  # the proxy refuses api@<CHAOS_MESH's commit> (403)
IMAGE_VERSION = "v1"  # bump when the images' recipe changes
PAUSE_IMAGE = f"pdchaos.local/pause:{IMAGE_VERSION}"
HOST_USR_IMAGE = f"pdchaos.local/host-usr:{IMAGE_VERSION}"
# package -> what shows it is installed
APT = {"containerd": "/usr/bin/containerd", "runc": "/usr/sbin/runc",
       "containernetworking-plugins": "/usr/lib/cni/bridge", "iptables": "/usr/sbin/iptables",
       "ipset": "/usr/sbin/ipset", "busybox-static": "/bin/busybox"}
CNI_BIN_DIR = "/usr/lib/cni"
BINARIES = {"kubelet": f"Kubernetes {KUBERNETES}", "chaos-controller-manager": CHAOS_MESH,
            "chaos-daemon": CHAOS_MESH}
NODE_PINS = {"kubernetes": KUBERNETES, "staging": STAGING, "chaos-mesh": CHAOS_MESH,
             "chaos-mesh-api": CHAOS_MESH_API, "images": IMAGE_VERSION, "kubelet-patch": "kernel-tunables-warn"}
TAG = f"k{KUBERNETES[1:]}-" + hashlib.sha256(json.dumps(NODE_PINS, sort_keys=True).encode()).hexdigest()[:8]

GO_TIMEOUT_S = 2400.0  # one go build, cold, niced, on a loaded 2-core box
CC_TIMEOUT_S = 120.0
VERSION_TIMEOUT_S = 20.0
KERNEL_TUNABLES_FILE = "pkg/kubelet/cm/container_manager_linux.go"
KERNEL_TUNABLES_FROM = "\tb := KernelTunableModify\n"
KERNEL_TUNABLES_TO = "\tb := KernelTunableWarn // pdchaos: never write host sysctls\n"


def k8s_root() -> Path:
    return Path(os.environ.get("PDCHAOS_K8S_HOME") or os.path.expanduser("~/.cache/pdchaos/k8s"))


def node_home() -> Path:
    """The folder of these pins: ``<k8s root>/node-<TAG>``."""
    return k8s_root() / f"node-{TAG}"


def node_binary(name: str) -> Path:
    if name not in BINARIES:
        raise KeyError(f"{name!r}: not a binary of the k8s-node stack ({', '.join(BINARIES)})")
    return node_home() / "bin" / name


def image_tar(name: str) -> Path:
    """``pause`` or ``host-usr``: the OCI image archive."""
    if name not in ("pause", "host-usr"):
        raise KeyError(f"{name!r}: no such image (pause, host-usr)")
    return node_home() / "images" / f"{name}.tar"


def node_crd_file() -> Path:
    return node_home() / "crds" / "chaos-mesh-crd.yaml"


def daemon_bin_dir() -> Path:
    """Mounted at /usr/local/bin in the chaos-daemon's pod: ``nsexec`` (stand-in) and ``pause``."""
    return node_home() / "daemon-bin"


def stamp_file() -> Path:
    return node_home() / "stamp.json"


def _version_ok(name: str) -> bool:
    from .stack import version_ok

    return version_ok(node_binary(name), BINARIES[name])


def missing_packages() -> list[str]:
    return [p for p, path in APT.items() if not os.path.exists(path)]


def missing(with_control_plane: bool = True) -> list[str]:
    """What is not there: packages, the control plane, binaries, files, the stamp."""
    out = missing_packages()
    if with_control_plane and [m for m in stack.missing()]:
        out.append("k8s control plane")
    out += [n for n in BINARIES if not _version_ok(n)]
    files = [node_crd_file(), image_tar("pause"), image_tar("host-usr"), daemon_bin_dir() / "nsexec",
             daemon_bin_dir() / "pause"]
    out += [str(f.relative_to(node_home())) for f in files if not (f.is_file() and f.stat().st_size > 0)]
    try:
        stamped = json.loads(stamp_file().read_text()).get("pins")
    except (OSError, ValueError, AttributeError):
        stamped = None
    return out + ([] if stamped == NODE_PINS else ["stamp"])


# ----------------------------------------------------------------------------- running things

def _run(cmd: list[str], what: str, timeout: float, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> str:
    """Run ``cmd`` in its own process group with a timeout; StepFailed naming ``what`` and the
    most telling line of its output."""
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    except OSError as exc:
        raise StepFailed(f"{what}: `{cmd[0]}` could not run: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        raise StepFailed(f"{what} did not finish within {timeout:g} s") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (err + "\n" + out).splitlines() if ln.strip()]
        bad = [ln for ln in lines if "error" in ln.lower() or "go: " in ln or "403" in ln or "E: " in ln]
        raise StepFailed(f"{what} exited {proc.returncode}: {(bad or lines or [''])[-1][:300]}")
    return out


def _go_build(go: str, args: list[str], cwd: Path, what: str, extra_env: dict[str, str] | None = None) -> None:
    env = stack._go_env(go, extra_env)
    _run(["nice", "-n", "19", go, "build", *args], what, GO_TIMEOUT_S, cwd=cwd, env=env)


def _install(built: Path, dest: Path, mode: int = 0o755) -> None:
    # a temporary name first: an interrupted copy never passes for the real file
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part")
    shutil.copyfile(built, part)
    part.chmod(mode)
    os.replace(part, dest)


def _copy_module(src: str, dest: Path) -> None:
    """A writable copy of a module folder from the (read-only) module cache."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=True)
    for root, dirs, files in os.walk(dest):
        for n in dirs + files:
            p = os.path.join(root, n)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR)
    os.chmod(dest, os.stat(dest).st_mode | stat.S_IWUSR)


# ----------------------------------------------------------------------------- the pieces

def _apt(packages: list[str]) -> None:
    if os.geteuid() != 0:
        raise StepFailed(f"{', '.join(packages)} not installed and not root, so apt-get cannot install them",
                         f"as root: apt-get install -y {' '.join(APT)}")
    if shutil.which("apt-get") is None:
        raise StepFailed(f"{', '.join(packages)} not installed and there is no apt-get",
                         f"install {', '.join(packages)} with this system's package manager")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    _run(["apt-get", "update", "-qq", *lock], "apt-get update", APT_UPDATE_TIMEOUT_S, env=env)
    _run(["apt-get", "install", "-y", "-qq", *lock, *packages], f"apt-get install {' '.join(packages)}",
         APT_INSTALL_TIMEOUT_S, env=env)
    still = missing_packages()
    if still:
        raise StepFailed(f"apt-get installed {', '.join(packages)} but {', '.join(APT[p] for p in still)} "
                         "is still missing")


def _build_kubelet(go: str, work: Path) -> None:
    info = stack._download(go, "k8s.io/kubernetes", KUBERNETES, work)
    staging = stack.staging_modules(Path(info["GoMod"]).read_text())
    if len(staging) < 20:
        raise StepFailed(f"k8s.io/kubernetes {KUBERNETES}'s go.mod lists {len(staging)} staging modules, expected ~29")
    src = work / "kubernetes"
    _copy_module(info["Dir"], src)
    target = src / KERNEL_TUNABLES_FILE
    text = target.read_text()
    if text.count(KERNEL_TUNABLES_FROM) != 1:
        raise StepFailed(f"{KERNEL_TUNABLES_FILE} in k8s.io/kubernetes {KUBERNETES} does not hold the line "
                         f"{KERNEL_TUNABLES_FROM.strip()!r} exactly once: the kubelet would write host sysctls")
    target.write_text(text.replace(KERNEL_TUNABLES_FROM, KERNEL_TUNABLES_TO))
    wrapper = work / "kubelet-build"
    wrapper.mkdir()
    pins = "\n".join(f"\t{m} => {m} {STAGING}" for m in staging)
    (wrapper / "go.mod").write_text(f"module pdchaos.local/kubeletbuild\n\ngo 1.24\n\nrequire k8s.io/kubernetes "
                                    f"{KUBERNETES}\n\nreplace (\n\tk8s.io/kubernetes => ../kubernetes\n{pins}\n)\n")
    major, minor = KUBERNETES[1:].split(".")[:2]
    pkgs = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    ld = ["-s", "-w"] + [f"-X {pkg}.{k}={v}" for pkg in pkgs
                         for k, v in (("gitVersion", KUBERNETES), ("gitMajor", major), ("gitMinor", minor),
                                      ("gitTreeState", "clean"))]
    out = work / "kubelet.out"
    _go_build(go, [f"-ldflags={' '.join(ld)}", "-o", str(out), "k8s.io/kubernetes/cmd/kubelet"], wrapper,
              "go build kubelet")
    _install(out, node_binary("kubelet"))


def _build_chaos_mesh(go: str, work: Path, names: list[str]) -> None:
    info = stack._download(go, "github.com/chaos-mesh/chaos-mesh", CHAOS_MESH, work)
    stack._download(go, "github.com/chaos-mesh/chaos-mesh/api", CHAOS_MESH_API, work)
    src = work / "chaos-mesh"
    _copy_module(info["Dir"], src)
    gomod = (src / "go.mod").read_text()
    local_api = re.compile(r"^(\s*github\.com/chaos-mesh/chaos-mesh/api\s+=>\s+)\./api\s*$", re.M)
    if len(local_api.findall(gomod)) != 1:
        raise StepFailed(f"chaos-mesh {CHAOS_MESH}'s go.mod does not replace its api module with ./api once "
                         "(the pin moved?)")
    (src / "go.mod").write_text(local_api.sub(rf"\g<1>github.com/chaos-mesh/chaos-mesh/api {CHAOS_MESH_API}", gomod))
    fake = src / "pkg" / "time" / "fakeclock"
    for c in sorted(fake.glob("*.c")):  # embedded by chaos-daemon (go:embed fakeclock/*.o)
        _run(["nice", "-n", "19", "cc", "-c", str(c), "-fPIE", "-O2", "-o", str(c.with_suffix(".o"))],
             f"cc {c.name}", CC_TIMEOUT_S)
    ld = f"-s -w -X github.com/chaos-mesh/chaos-mesh/pkg/version.gitVersion={CHAOS_MESH}"
    for name in names:
        out = work / f"{name}.out"
        cgo = "1" if name == "chaos-daemon" else "0"
        _go_build(go, [f"-ldflags={ld}", "-o", str(out), f"./cmd/{name}"], src, f"go build {name}",
                  {"CGO_ENABLED": cgo})
        _install(out, node_binary(name))


def patch_crds(text: str) -> str:
    """Chaos Mesh's CRD file with ``partitionBehavior`` (drop|reject) added to every NetworkChaos
    spec schema (a ``properties`` map whose ``action`` enum holds partition and bandwidth) that
    lacks it: the api module we build against has and defaults that field."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    docs = [d for d in yaml.load_all(text, Loader=loader) if d]
    added = 0

    def walk(node: Any) -> None:
        nonlocal added
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                enum = (props.get("action") or {}).get("enum") if isinstance(props.get("action"), dict) else None
                if enum and {"partition", "bandwidth"} <= set(enum) and "partitionBehavior" not in props:
                    props["partitionBehavior"] = {
                        "type": "string", "enum": ["drop", "reject"], "default": "drop",
                        "description": "how packets matched by a partition are handled (added by pd-chaos: "
                                       "the api module built against has this field)"}
                    added += 1
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for d in docs:
        walk(d)
    if not added and "partitionBehavior" not in text:
        raise StepFailed("no NetworkChaos spec found in Chaos Mesh's CRDs to add partitionBehavior to")
    return yaml.dump_all(docs, Dumper=dumper, sort_keys=False)


# A stand-in for Chaos Mesh's nsexec helper, which is a release download that cannot be had here.
# chaos-daemon runs ``nsexec [-l] [-m PATH] [-i PATH] [-n PATH] [-p PATH] -- CMD ARGS...``; this enters
# the namespaces with util-linux nsenter. With ``-l`` (run the daemon's own program inside the target's
# mount namespace) the mount namespace is NOT entered: the command then sees the daemon's files,
# which is what iptables/ipset/tc need; faults that need the target's files (IOChaos) do not work.
NSEXEC = r"""#!/bin/sh
# pd-chaos: a STAND-IN for Chaos Mesh's nsexec (runtimes/k8s/node_stack.py), over nsenter.
set -e
local_mnt=0
args=""
while [ $# -gt 0 ]; do
  case "$1" in
    -l) local_mnt=1; shift ;;
    -m) mnt="$2"; shift 2 ;;
    -i) args="$args --ipc=$2"; shift 2 ;;
    -n) args="$args --net=$2"; shift 2 ;;
    -p) args="$args --pid=$2"; shift 2 ;;
    -u) args="$args --uts=$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "nsexec (pd-chaos stand-in): unknown option $1" >&2; exit 2 ;;
  esac
done
if [ -n "${mnt:-}" ] && [ "$local_mnt" = 0 ]; then args="$args --mount=$mnt"; fi
[ $# -gt 0 ] || { echo "nsexec (pd-chaos stand-in): no command" >&2; exit 2; }
# shellcheck disable=SC2086
exec nsenter $args -- "$@"
"""

PAUSE_C = r"""/* pd-chaos's sandbox ("pause") process: holds a pod's namespaces, reaps what is re-parented
   to it, and exits at once on SIGINT or SIGTERM. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_quit(int sig) { (void)sig; _exit(0); }

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction quit, child;
    memset(&quit, 0, sizeof quit);
    memset(&child, 0, sizeof child);
    quit.sa_handler = on_quit;
    child.sa_handler = on_child;
    child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    if (sigaction(SIGINT, &quit, NULL) || sigaction(SIGTERM, &quit, NULL) || sigaction(SIGCHLD, &child, NULL))
        return 1;
    for (;;)
        pause();
}
"""


def _build_pause(work: Path) -> Path:
    src = work / "pause.c"
    src.write_text(PAUSE_C)
    out = work / "pause"
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise StepFailed("no C compiler (gcc) to build the pause program", "as root: apt-get install -y gcc libc6-dev")
    _run([cc, "-static", "-O2", "-s", "-o", str(out), str(src)], "gcc -static pause.c", CC_TIMEOUT_S)
    return out


def _tar_layer(entries: list[tuple[str, str, Any]]) -> bytes:
    """An uncompressed layer tar, reproducible (fixed times and owners). ``entries``: (path, kind,
    data) with kind ``dir`` (data: mode), ``file`` (data: (bytes, mode)), ``link`` (data: target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, kind, data in entries:
            info = tarfile.TarInfo(path)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, data
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, data, 0o777
                tar.addfile(info)
            else:
                body, mode = data
                info.size, info.mode = len(body), mode
                tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def write_oci_archive(dest: Path, name: str, layer: bytes, config: dict[str, Any]) -> None:
    """An OCI image layout, as a tar, holding one image ``name`` of one uncompressed layer:
    what ``ctr images import`` reads (the name from the ``io.containerd.image.name`` annotation)."""
    def blob(data: bytes) -> tuple[str, bytes]:
        return "sha256:" + hashlib.sha256(data).hexdigest(), data

    layer_digest, _ = blob(layer)
    cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": config,
                      "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
                      "history": [{"created_by": "pd-chaos runtimes/k8s/node_stack.py"}]},
                     sort_keys=True).encode()
    cfg_digest, _ = blob(cfg)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": cfg_digest, "size": len(cfg)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                       "digest": layer_digest, "size": len(layer)}]}, sort_keys=True).encode()
    man_digest, _ = blob(manifest)
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man_digest, "size": len(manifest),
        "annotations": {"io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}]}).encode()
    files = [("oci-layout", "file", (b'{"imageLayoutVersion":"1.0.0"}', 0o644)), ("index.json", "file", (index, 0o644)),
             ("blobs", "dir", 0o755), ("blobs/sha256", "dir", 0o755)]
    files += [(f"blobs/sha256/{d.split(':')[1]}", "file", (b, 0o644))
              for d, b in ((layer_digest, layer), (cfg_digest, cfg), (man_digest, manifest))]
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part")
    part.write_bytes(_tar_layer(files))
    os.replace(part, dest)


def _host_usr_layer() -> bytes:
    """The host-/usr image's root file system: empty /usr (the pod mounts the host's), the usual
    top-level links into it, a root user."""
    entries: list[tuple[str, str, Any]] = [(d, "dir", 0o755) for d in ("usr", "etc", "root", "var", "run", "proc",
                                                                        "sys", "dev", "home", "opt", "mnt")]
    entries.append(("tmp", "dir", 0o1777))
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink(f"/{top}") or os.path.isdir(f"/usr/{top}"):
            entries.append((top, "link", f"usr/{top}"))
    entries += [("etc/passwd", "file", (b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:"
                                        b"/usr/sbin/nologin\n", 0o644)),
                ("etc/group", "file", (b"root:x:0:\nnogroup:x:65534:\n", 0o644))]
    return _tar_layer(entries)


def _make_images(work: Path) -> None:
    pause = _build_pause(work)
    write_oci_archive(image_tar("pause"), PAUSE_IMAGE,
                      _tar_layer([("pause", "file", (pause.read_bytes(), 0o755))]),
                      {"Entrypoint": ["/pause"], "WorkingDir": "/"})
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    write_oci_archive(image_tar("host-usr"), HOST_USR_IMAGE, _host_usr_layer(),
                      {"Env": [f"PATH={path}"], "Cmd": ["/bin/sh"], "WorkingDir": "/"})
    _install(pause, daemon_bin_dir() / "pause")
    nsexec = work / "nsexec"
    nsexec.write_text(NSEXEC)
    _install(nsexec, daemon_bin_dir() / "nsexec")


def _write_crds() -> None:
    src = stack.crd_file("chaos-mesh")
    if not src.is_file():
        raise StepFailed(f"{src} is missing: the k8s step did not fetch Chaos Mesh's CRDs")
    dest = node_crd_file()
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part")
    part.write_text(patch_crds(src.read_text()))
    os.replace(part, dest)


# ----------------------------------------------------------------------------- the step

class K8sNodeStep:
    """The setup step (protocol: harness/setup.py). Optional: only ``--only k8s-node`` runs it."""

    name = "k8s-node"
    optional = True
    side_by_side = False  # apt-get first: it must not run beside the other apt steps

    def check(self) -> str | None:
        if missing():
            return None
        return (f"kubelet {KUBERNETES} (kernel tunables: warn only), containerd, Chaos Mesh controller and daemon, "
                f"images at {node_home()}")

    def how(self) -> str:
        return ("as root, with Go 1.24+ that can reach its module proxy: `pdchaos setup --only k8s-node` "
                f"(Debian: apt-get install -y {' '.join(APT)})")

    def _go_or_fail(self) -> str:
        go = stack.find_go()
        if go is None:
            raise StepFailed("Go is not installed, so the kubelet and Chaos Mesh cannot be built here", self.how())
        return go

    def plan(self) -> str:
        todo = [m for m in missing() if m != "stamp"]
        if not todo:
            return f"nothing to do: all present in {node_home()}"
        if missing_packages() and os.geteuid() != 0:
            raise StepFailed(f"{', '.join(missing_packages())} not installed and not root", self.how())
        go = self._go_or_fail()
        return (f"install/build {', '.join(todo)} with {go} into {node_home()} "
                "(cold: ~15 min on 2 cores, ~3 GB more Go caches)")

    def install(self) -> str:
        todo = missing()
        if not todo:
            return f"already built at {node_home()}: nothing rebuilt"
        home, t0, done = node_home(), time.monotonic(), []
        work = k8s_root() / ".node-build"  # a fixed path: Go's build cache then serves a rebuild
        try:
            pkgs = missing_packages()
            if pkgs:
                _apt(pkgs)
                done.append("apt: " + " ".join(pkgs))
            go = self._go_or_fail()
            if "k8s control plane" in todo:
                stack.step().install()
                done.append("k8s control plane")
            for sub in ("bin", "images", "crds", "daemon-bin"):
                (home / sub).mkdir(parents=True, exist_ok=True)
            stamp_file().unlink(missing_ok=True)
            if work.exists():
                shutil.rmtree(work)
            work.mkdir(parents=True)
            timings = {}
            if "kubelet" in todo:
                t = time.monotonic()
                _build_kubelet(go, work)
                timings["kubelet"] = round(time.monotonic() - t, 1)
            chaos = [n for n in ("chaos-controller-manager", "chaos-daemon") if n in todo]
            if chaos:
                t = time.monotonic()
                _build_chaos_mesh(go, work, chaos)
                timings[" and ".join(chaos)] = round(time.monotonic() - t, 1)
            done += [n for n in BINARIES if n in todo]
            _make_images(work)
            _write_crds()
            done.append("images, nsexec stand-in, CRDs")
        except StepFailed as exc:
            raise StepFailed(exc.why, exc.how or self.how()) from None
        except OSError as exc:
            raise StepFailed(f"writing the k8s-node stack into {home}: {exc.strerror or exc}", self.how()) from None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        left = [m for m in missing() if m != "stamp"]
        if left:
            raise StepFailed(f"built, but still missing or not at the pinned version: {', '.join(left)}", self.how())
        seconds = time.monotonic() - t0
        stamp_file().write_text(json.dumps({"pins": NODE_PINS, "built": done, "seconds": round(seconds, 1),
                                            "build_seconds": timings}, indent=1) + "\n")
        return f"installed {'; '.join(done)} into {home} in {seconds:.0f} s"


def step() -> K8sNodeStep:
    return K8sNodeStep()
