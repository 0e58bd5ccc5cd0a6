"""``pdchaos setup --only k8s``: the binaries of a real Kubernetes control plane and the pinned CRD
files, built from the Go module proxy into a cache, idempotently (a second run builds nothing).

What and why:

* etcd v3.6.6 (the 3.5 on PyPI is too old: the API server then turns off the watch progress
  requests kwok's client relies on, and pods stay Pending), its own modules pinned to the same
  release;
* kube-apiserver, kube-controller-manager, kube-scheduler v1.34.4 (k8s.io/kubernetes with its
  staging modules, read from its go.mod at build time, pinned to v0.34.4); the version is set with
  ``-ldflags -X`` as the release build does, so clients can parse it. The tests need all three:
  the k8s runtime under test creates Deployments, Services and LeaderWorkerSets and waits for their
  pods, so the controllers (ReplicaSets, pods, default ServiceAccounts, namespace deletion) and the
  scheduler (placement, and its "unschedulable" verdict a run must report) are the real ones;
* kwok v0.7.0 (plays the kubelet: node heartbeats and pod status) and its ``fast`` stages, built
  against the control plane's own v0.34.4 libraries (v0.8.0 needs 0.36's kubelet log API; v0.7.0
  needs one constant 0.34 dropped, written out in our copy: KWOK_PATCH), so that
* all five come from ONE wrapper module and ONE ``go build``: the Kubernetes libraries, gRPC and
  etcd's client, which the five share, are compiled once (82 MB of Go source against 134 MB in
  three builds, docs/ci.md);
* the CRDs the k8s runtime's objects are validated against: Chaos Mesh's ``manifests/crd.yaml``
  at a pinned commit (no semver tags on the proxy) and LeaderWorkerSet's, fetched while the build
  compiles.

Everything lands in ``${PDCHAOS_K8S_HOME:-~/.cache/pdchaos/k8s}/<TAG>/`` (``bin/``, ``crds/``,
``stamp.json`` written last, with the build's times). Go's module and build caches are the user's
own (GOPATH, GOCACHE untouched), so a rebuild after a pin change is mostly linking.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from harness.setup import StepFailed

# ----------------------------------------------------------------------------- the pins (one place)
ETCD = "v3.6.6"
KUBERNETES = "v1.34.4"
STAGING = "v0.34.4"  # k8s.io/api, k8s.io/apiserver, ... of the same release
KWOK = "v0.7.0"  # built against STAGING in the same module (v0.8.0 needs k8s 0.36: it does not compile so)
# ... from a copy with one constant written out: apimachinery 0.34 dropped it (only client-go's watch-list
# path reads it, off by default in 0.34, and the 1.34 API server no longer sends that annotation)
KWOK_PATCH = ("pkg/utils/informer/informer.go", "metav1.InitialEventsListBlueprintAnnotationKey",
              '"kubernetes.io/initial-events-list-blueprint"', 2)
CHAOS_MESH = "v0.9.1-0.20260902003049-47411975a8cb"  # has manifests/crd.yaml (23 CRDs, v1alpha1)
LWS = "v0.8.0"  # the LWS release built against k8s.io/api v0.34 (v0.9+ moved to 0.36)

ETCD_MODULES = ("api/v3", "client/pkg/v3", "client/v3", "pkg/v3")  # pinned beside server/v3
KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
STAGING_LEFT_OUT = ("k8s.io/sample-cli-plugin", "k8s.io/sample-controller")  # 403 on the proxy, unused
# what each binary's --version must print
VERSIONS = {"etcd": f"etcd Version: {ETCD[1:]}", **{n: f"Kubernetes {KUBERNETES}" for n in KUBE_BINARIES},
            "kwok": f"kwok version {KWOK}"}
# name -> (module, version, path inside it, file in crds/); kwok's stages are rendered, not copied
FILES = {
    "chaos-mesh": ("github.com/chaos-mesh/chaos-mesh", CHAOS_MESH, "manifests/crd.yaml", "chaos-mesh-crd.yaml"),
    "lws": ("sigs.k8s.io/lws", LWS, "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
            "lws-crd.yaml"),
    "kwok-stages": ("sigs.k8s.io/kwok", KWOK, "kustomize/stage/fast", "kwok-stages-fast.yaml"),
}
PINS = {"etcd": ETCD, "kubernetes": KUBERNETES, "staging": STAGING, "kwok": KWOK, "chaos-mesh": CHAOS_MESH,
        "lws": LWS}
TAG = f"k{KUBERNETES[1:]}-" + hashlib.sha256(json.dumps(PINS, sort_keys=True).encode()).hexdigest()[:8]

GO_TIMEOUT_S = 1800.0  # one go command, cold, on 2 cores (the kube build alone is ~4 min warm)
DOWNLOAD_TIMEOUT_S = 600.0
VERSION_TIMEOUT_S = 20.0


def k8s_home() -> Path:
    """The cache folder of these pins."""
    root = os.environ.get("PDCHAOS_K8S_HOME") or os.path.expanduser("~/.cache/pdchaos/k8s")
    return Path(root) / TAG


def binary(name: str) -> Path:
    """``etcd``, ``kube-apiserver``, ``kube-controller-manager``, ``kube-scheduler`` or ``kwok``."""
    if name not in VERSIONS:
        raise KeyError(f"{name!r}: not a binary of the k8s stack ({', '.join(VERSIONS)})")
    return k8s_home() / "bin" / name


def crd_file(name: str) -> Path:
    """``chaos-mesh`` or ``lws``: the pinned CRD file."""
    if name not in ("chaos-mesh", "lws"):
        raise KeyError(f"{name!r}: no such CRD file (chaos-mesh, lws)")
    return k8s_home() / "crds" / FILES[name][3]


def kwok_stages() -> Path:
    """kwok's ``fast`` stages (node-initialize, heartbeat with lease, pod ready/complete/delete)."""
    return k8s_home() / "crds" / FILES["kwok-stages"][3]


def stamp_file() -> Path:
    return k8s_home() / "stamp.json"


def binary_version_ok(name: str) -> bool:
    """The binary runs (within a timeout) and prints its pinned version."""
    return version_ok(binary(name), VERSIONS[name])


def version_ok(path: Path, expected: str) -> bool:
    """``path --version`` runs within a timeout and prints ``expected``."""
    if not (path.is_file() and os.access(path, os.X_OK)):
        return False
    try:
        res = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0 and expected in res.stdout + res.stderr


def _file_ok(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def missing() -> list[str]:
    """What is not there: binaries that do not report their pin, files, the stamp."""
    out = [n for n in VERSIONS if not binary_version_ok(n)]
    out += [n for n in FILES if not _file_ok(k8s_home() / "crds" / FILES[n][3])]
    try:
        stamped = json.loads(stamp_file().read_text()).get("pins")
    except (OSError, ValueError, AttributeError):
        stamped = None
    return out + ([] if stamped == PINS else ["stamp"])


# ----------------------------------------------------------------------------- running go

def find_go() -> str | None:
    cands = [shutil.which("go") or "", "/usr/local/go/bin/go", os.path.expanduser("~/go/bin/go")]
    return next((c for c in cands if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def _go_env(go: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    # the user's GOPATH/GOCACHE (shared caches); our wrapper modules only, never a go.work around
    flags = " ".join(f for f in (os.environ.get("GOFLAGS", ""), "-mod=mod") if f)
    return {**os.environ, "PATH": f"{os.path.dirname(go)}{os.pathsep}{os.environ.get('PATH', '')}",
            "GOFLAGS": flags, "GOWORK": "off", "GO111MODULE": "on", **(extra or {})}


def _go(go: str, args: list[str], cwd: Path, timeout: float = GO_TIMEOUT_S,
        env: dict[str, str] | None = None) -> str:
    """``go ARGS`` in ``cwd``; StepFailed naming the command and the go command's error line."""
    what = f"go {' '.join(a for a in args if not a.startswith('-'))[:120]}"
    try:  # its own process group: a timeout ends the compilers and linkers it started too
        proc = subprocess.Popen([go, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, env=_go_env(go, env), start_new_session=True)
    except OSError as exc:
        raise StepFailed(f"`{go}` could not run: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        raise StepFailed(f"`{what}` did not finish within {timeout:g} s") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (err + "\n" + out).splitlines() if ln.strip()]
        bad = [ln for ln in lines if "error" in ln.lower() or "go: " in ln or "403" in ln]
        raise StepFailed(f"`{what}` exited {proc.returncode}: {(bad or lines or [''])[-1][:300]}")
    return out


def _download(go: str, module: str, version: str, tmp: Path) -> dict:
    """``go mod download -json``: the module's folder (``Dir``) and go.mod (``GoMod``) in the cache."""
    out = _go(go, ["mod", "download", "-json", f"{module}@{version}"], tmp, timeout=DOWNLOAD_TIMEOUT_S)
    try:
        info = json.loads(out)
    except ValueError:
        raise StepFailed(f"go mod download {module}@{version}: unreadable answer") from None
    if info.get("Error") or not info.get("Dir"):
        raise StepFailed(f"{module}@{version}: the Go module proxy refused it: {str(info.get('Error'))[:200]}")
    return info


# ----------------------------------------------------------------------------- the step

class K8sStackStep:
    """The setup step (protocol: harness/setup.py)."""

    name = "k8s"
    side_by_side = True  # a Go build touches no package manager: it runs beside the other steps

    def check(self) -> str | None:
        if missing():
            return None
        return (f"etcd {ETCD}, kube-apiserver/controller-manager/scheduler {KUBERNETES}, kwok {KWOK}, "
                f"CRDs at {k8s_home() / 'crds'}")

    def how(self) -> str:
        return (f"install Go 1.24+ that can reach its module proxy and rerun `pdchaos setup --only k8s`; or put etcd "
                f"{ETCD}, {', '.join(KUBE_BINARIES)} {KUBERNETES} and kwok {KWOK} in {k8s_home() / 'bin'} and rerun it")

    def _go_or_fail(self) -> str:
        go = find_go()
        if go is None:
            raise StepFailed("Go is not installed, so the k8s control plane cannot be built here", self.how())
        return go

    def plan(self) -> str:
        go = self._go_or_fail()
        todo = [m for m in missing() if m != "stamp"]
        if not todo:
            return f"nothing to build: all present in {k8s_home()}"
        return (f"build/fetch {', '.join(todo)} with {go} into {k8s_home()} "
                "(one go build; cold: ~3.5 GB of Go caches, minutes on 2 cores)")

    def install(self) -> str:
        todo = missing()
        if not todo:
            return f"already built at {k8s_home()}: nothing rebuilt"
        go = self._go_or_fail()
        home = k8s_home()
        try:
            for sub in ("bin", "crds"):
                (home / sub).mkdir(parents=True, exist_ok=True)
            stamp_file().unlink(missing_ok=True)
        except OSError as exc:
            raise StepFailed(f"cannot write the k8s stack's cache {home}: {exc.strerror or exc}",
                             "set PDCHAOS_K8S_HOME to a writable folder and rerun `pdchaos setup --only k8s`") from None
        done, t0, times = [], time.monotonic(), {}
        try:
            with tempfile.TemporaryDirectory(prefix="pdchaos-k8s-build-") as tmp:
                files = [n for n in FILES if n in todo]
                fetch = _Beside(lambda: [_fetch_file(go, Path(tmp), n) for n in files]) if files else None
                names = [n for n in VERSIONS if n in todo]
                if names:
                    t1 = time.monotonic()
                    _build(go, Path(tmp), names)
                    times["go build"] = round(time.monotonic() - t1, 1)
                    done += names
                if fetch is not None:
                    fetch.join()
                    times["files"] = fetch.seconds
                    done += files
        except StepFailed as exc:
            raise StepFailed(exc.why, exc.how or self.how()) from None
        except OSError as exc:  # a full disk, a folder gone under us
            raise StepFailed(f"writing the k8s stack into {home}: {exc.strerror or exc}", self.how()) from None
        left = [m for m in missing() if m != "stamp"]
        if left:
            raise StepFailed(f"built, but still missing or not at the pinned version: {', '.join(left)}", self.how())
        seconds = time.monotonic() - t0
        stamp_file().write_text(json.dumps({"pins": PINS, "built": done, "seconds": round(seconds, 1),
                                            "times": times,
                                            "go": _go(go, ["env", "GOVERSION"], home, timeout=30).strip()},
                                           indent=1) + "\n")
        parts = ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
        return (f"built {', '.join(done) or 'nothing (stamped)'} into {home} in {seconds:.0f} s"
                + (f" ({parts}, side by side)" if len(times) > 1 else ""))


def step() -> K8sStackStep:
    return K8sStackStep()


# ----------------------------------------------------------------------------- the pieces

class _Beside:
    """``fn()`` in a thread (the CRD downloads while the build compiles); ``join()`` re-raises its
    StepFailed or OSError here."""

    def __init__(self, fn) -> None:
        self.seconds = 0.0
        self._exc: BaseException | None = None
        self._t0 = time.monotonic()

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - handed to join()
                self._exc = exc
            self.seconds = round(time.monotonic() - self._t0, 1)

        self._thread = threading.Thread(target=run, name="k8s-files", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join(DOWNLOAD_TIMEOUT_S * len(FILES) + 60)
        if self._thread.is_alive():
            raise StepFailed(f"the CRD downloads did not finish within {DOWNLOAD_TIMEOUT_S * len(FILES):g} s")
        if self._exc is not None:
            raise self._exc


def wrapper_gomod(module: str, staging: list[str], local: dict[str, str] | None = None) -> str:
    """Our own recipe: a go.mod that requires the control plane's three modules and pins what must
    match (the staging modules to STAGING, etcd's modules to ETCD); ``local``: module -> folder
    replacements (our patched copies)."""
    pins = [(m, f"{m} {STAGING}") for m in staging] + \
           [(f"go.etcd.io/etcd/{m}", f"go.etcd.io/etcd/{m} {ETCD}") for m in ETCD_MODULES]
    pins += [(m, d) for m, d in (local or {}).items()]
    lines = "\n".join(f"\t{m} => {to}" for m, to in pins)
    return (f"module pdchaos.local/{module}\n\ngo 1.24\n\nrequire (\n\tk8s.io/kubernetes {KUBERNETES}\n"
            f"\tgo.etcd.io/etcd/server/v3 {ETCD}\n\tsigs.k8s.io/kwok {KWOK}\n)\n\nreplace (\n{lines}\n)\n")


def version_ldflags() -> list[str]:
    """``-X`` flags that set the Kubernetes version as hack/lib/version.sh does."""
    major, minor = KUBERNETES[1:].split(".")[:2]
    pkgs = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    return [f"-X {pkg}.{k}={v}" for pkg in pkgs
            for k, v in (("gitVersion", KUBERNETES), ("gitMajor", major), ("gitMinor", minor),
                         ("gitTreeState", "clean"))]


def _install_binary(built: Path, name: str) -> None:
    # into bin/ under a temporary name first: an interrupted copy never passes for a binary
    part = binary(name).with_name(f".{name}.part")
    shutil.copyfile(built, part)
    part.chmod(0o755)
    os.replace(part, binary(name))


def staging_modules(gomod_text: str) -> list[str]:
    """The staging modules k8s.io/kubernetes' go.mod replaces with ./staging/src/... (those we pin)."""
    mods = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/src/", gomod_text, re.M)
    return [m for m in dict.fromkeys(mods) if m not in STAGING_LEFT_OUT]


def read_staging(go: str, tmp: Path) -> list[str]:
    info = _download(go, "k8s.io/kubernetes", KUBERNETES, tmp)
    staging = staging_modules(Path(info["GoMod"]).read_text())
    if len(staging) < 20:
        raise StepFailed(f"k8s.io/kubernetes {KUBERNETES}'s go.mod lists {len(staging)} staging modules, expected ~29")
    return staging


# the main package of each binary; `go build -o DIR/` names a binary after its package's last path
# element that is not a major version (etcd's server/v3 -> "server")
PACKAGES = {"etcd": ("go.etcd.io/etcd/server/v3", "server"),
            **{n: (f"k8s.io/kubernetes/cmd/{n}", n) for n in KUBE_BINARIES},
            "kwok": ("sigs.k8s.io/kwok/cmd/kwok", "kwok")}


def _kwok_copy(go: str, dest: Path) -> None:
    """A writable copy of kwok's module with KWOK_PATCH applied (refused if the line moved)."""
    src = _download(go, "sigs.k8s.io/kwok", KWOK, dest.parent)["Dir"]
    shutil.copytree(src, dest, symlinks=True)
    for root, dirs, _files in os.walk(dest):  # the module cache's folders are read-only
        for n in dirs:
            os.chmod(os.path.join(root, n), 0o755)
    os.chmod(dest, 0o755)
    rel, old, new, count = KWOK_PATCH
    target = dest / rel
    text = target.read_text()
    if text.count(old) != count:
        raise StepFailed(f"{rel} in sigs.k8s.io/kwok {KWOK} names {old} {text.count(old)} times, not {count}: "
                         "the pinned patch no longer fits")
    target.chmod(0o644)
    target.write_text(text.replace(old, new))


def _build(go: str, tmp: Path, names: list[str]) -> None:
    """One ``go build`` of ``names`` in one wrapper module."""
    d = tmp / "k8s"
    d.mkdir()
    local = {}
    if "kwok" in names:
        _kwok_copy(go, tmp / "kwok")
        local["sigs.k8s.io/kwok"] = "../kwok"
    (d / "go.mod").write_text(wrapper_gomod("k8sbuild", read_staging(go, tmp), local=local))
    out = tmp / "out"
    out.mkdir()
    _go(go, ["build", f"-ldflags={' '.join(['-s', '-w', *version_ldflags()])}", "-o", f"{out}/",
             *[PACKAGES[n][0] for n in names]], d)
    for n in names:
        _install_binary(out / PACKAGES[n][1], n)


def _fetch_file(go: str, tmp: Path, name: str) -> None:
    module, version, inner, out = FILES[name]
    src = Path(_download(go, module, version, tmp)["Dir"]) / inner
    dest = k8s_home() / "crds" / out
    if name == "kwok-stages":
        text = render_kustomization(src)
    elif src.is_file():
        text = src.read_text()
    else:
        raise StepFailed(f"{module}@{version} has no {inner} (the pinned path moved?)")
    part = dest.with_name(f".{out}.part")
    part.write_text(text)
    os.replace(part, dest)


def render_kustomization(folder: Path) -> str:
    """The YAML documents a kustomization's ``resources`` list (files, or folders with their own
    kustomization), in order, as one multi-document file. kwok's stage folders use nothing else
    of kustomize (no patches, no generators); anything more is refused rather than rendered wrong."""
    import yaml

    path = folder / "kustomization.yaml"
    if not path.is_file():
        raise StepFailed(f"{folder} has no kustomization.yaml")
    spec = yaml.safe_load(path.read_text()) or {}
    extra = set(spec) - {"apiVersion", "kind", "resources"}
    if extra:
        raise StepFailed(f"{path} uses {', '.join(sorted(extra))}: more of kustomize than this renderer does")
    docs = []
    for res in spec.get("resources") or []:
        p = (folder / res).resolve()
        if p.is_dir():
            docs.append(render_kustomization(p))
        elif p.is_file():
            text = p.read_text()
            if not any(yaml.safe_load_all(text)):  # parses, and holds a document
                raise StepFailed(f"{p} holds no YAML document")
            docs.append(re.sub(r"\A(\s*---\s*\n)+", "", text).strip() + "\n")
        else:
            raise StepFailed(f"{path} lists {res}, which is not there")
    return "---\n".join(docs)
