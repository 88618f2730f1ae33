"""A stand-in `kubeadm`/`kubectl`/`kubelet` for lab hosts, installed by the TESTS, never by the
role. The real Kubernetes is built here from Go modules and runs in test_kubernetes.py; this
stand-in serves test_role_kubernetes.py, which asserts on the order and timing of every kubeadm
call (joins one at a time, the join rate, no token in any output) in a lab that boots in
seconds and that no real kubeadm could answer as quickly.

The stand-in records every call (arguments, start and end time, host) as one JSON line in
/var/log/kube-standin.log and writes the files kubeadm would write (admin.conf, kubelet.conf,
pki/ca.crt ...), so the role's real code path (facts, init, joins, waits) runs unchanged against
it. Its kubectl keeps the objects of `apply --server-side --field-manager=gpuinfra
--force-conflicts` as the "live" ones (each object's text, by kind, namespace and name, in
/var/lib/kube-standin/live.json) and answers `diff` (exit 1 when a file's object differs from
the live one) and `wait` (exit 1 while an object is not live) from them. `kubeadm token
create` and `upload-certs` invent a token and a key like kubeadm does and list them in
/var/lib/kube-standin/issued, so a test can search every output for them. It refuses a join or
init file that still holds a GPUINFRA_ placeholder or no token.
"""

from __future__ import annotations

import json
import shlex

from inventory.versions import KubernetesVersion

LOG = "/var/log/kube-standin.log"
ISSUED = "/var/lib/kube-standin/issued"
VERSION_FILE = "/var/lib/kube-standin/version"

KUBEADM = r'''#!/usr/bin/python3
"""Stand-in kubeadm (gpuinfra lab tests): records calls, writes what kubeadm would write."""
import json, os, random, re, socket, string, sys, time

LOG = "/var/log/kube-standin.log"
STATE = "/var/lib/kube-standin"
started = time.time()
argv = sys.argv[1:]
os.makedirs(STATE, exist_ok=True)


def version():
    try:
        return open(f"{STATE}/version").read().strip()
    except OSError:
        return "@VERSION@"


def record(rc, **extra):
    entry = {"host": socket.gethostname(), "tool": "kubeadm", "argv": argv, "start": started,
             "end": time.time(), "rc": rc, **extra}
    with open(LOG, "a") as log:
        log.write(json.dumps(entry) + "\n")
    sys.exit(rc)


def write(path, text, mode=0o600):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)
    os.chmod(path, mode)


def issue(kind, value):
    with open(f"{STATE}/issued", "a") as handle:
        handle.write(f"{kind} {value}\n")


def config_file():
    return argv[argv.index("--config") + 1]


def checked_config():
    text = open(config_file()).read()
    if any("GPUINFRA_" in line for line in text.splitlines() if not line.startswith("#")):
        print("error: a GPUINFRA_ placeholder was not filled in", file=sys.stderr)
        record(1, error="placeholder")
    return text


def kubeconfigs(control_plane):
    for name in ("kubelet.conf",) + (("admin.conf", "super-admin.conf", "controller-manager.conf",
                                      "scheduler.conf") if control_plane else ()):
        write(f"/etc/kubernetes/{name}", f"apiVersion: v1\nkind: Config\n# stand-in {name}\n")
    write("/etc/kubernetes/pki/ca.crt", "stand-in CA\n", 0o644)
    if control_plane:
        write("/etc/kubernetes/pki/ca.key", "stand-in CA key\n")
        # As kubeadm writes it from the role's config: the API server reads its encryption
        # configuration (roles/kubernetes/encryption.py; drift checks the flag is there).
        write("/etc/kubernetes/manifests/kube-apiserver.yaml",
              "# stand-in\n    - --encryption-provider-config=/etc/kubernetes/encryption.yaml\n")


def rand(alphabet, n):
    return "".join(random.SystemRandom().choice(alphabet) for _ in range(n))


words = [a for a in argv if not a.startswith("-")]
if argv[:1] == ["version"]:
    print(version())
    record(0)
if words[:2] == ["config", "validate"]:
    text = checked_config()
    if not re.search(r"kind: (InitConfiguration|JoinConfiguration)", text):
        print("error: no Init/JoinConfiguration", file=sys.stderr)
        record(1)
    record(0)
if words[:1] == ["init"] and "phase" not in words:
    checked_config()
    time.sleep(1)
    kubeconfigs(True)
    record(0)
if words[:3] == ["init", "phase", "upload-certs"]:
    key = rand("0123456789abcdef", 64)
    issue("certificate-key", key)
    print("[upload-certs] Storing the certificates in Secret \"kubeadm-certs\"")
    print("[upload-certs] Using certificate key:")
    print(key)
    record(0)
if words[:2] == ["token", "create"]:
    chars = string.ascii_lowercase + string.digits
    token = rand(chars, 6) + "." + rand(chars, 16)
    issue("token", token)
    print(f"kubeadm join api.standin:6443 --token {token} "
          f"--discovery-token-ca-cert-hash sha256:{rand('0123456789abcdef', 64)}")
    record(0)
if words[:1] == ["join"]:
    text = checked_config()
    if not re.search(r"token: [a-z0-9]{6}\.[a-z0-9]{16}", text):
        print("error: no bootstrap token in the join file", file=sys.stderr)
        record(1)
    time.sleep(1)
    kubeconfigs("controlPlane:" in text)
    record(0, control_plane="controlPlane:" in text)
if words[:1] == ["reset"]:
    for root, _dirs, names in os.walk("/etc/kubernetes", topdown=False):
        for name in names:
            if "gpuinfra" not in root:
                os.remove(os.path.join(root, name))
    record(0)
if words[:2] == ["upgrade", "apply"]:
    time.sleep(0.5)
    write(f"{STATE}/version", words[2] + "\n", 0o644)
    record(0)
if words[:2] == ["upgrade", "plan"]:
    print(f"You can now apply the upgrade by executing: kubeadm upgrade apply {words[2]}")
    record(0)
if words[:2] == ["upgrade", "node"]:
    time.sleep(0.5)
    record(0)
if words[:2] == ["certs", "check-expiration"]:
    print("CERTIFICATE   EXPIRES   RESIDUAL TIME\napiserver   Nov 23, 2027 10:00 UTC   364d")
    record(0)
if words[:2] == ["certs", "renew"]:
    record(0)
print(f"stand-in kubeadm: unhandled {argv}", file=sys.stderr)
record(2)
'''

KUBECTL = r'''#!/usr/bin/python3
"""Stand-in kubectl (gpuinfra lab tests): /healthz answers when a kubeconfig exists; apply,
diff and wait keep "live" objects in a file, each object's text by kind/namespace/name."""
import json, os, re, socket, sys, time

started = time.time()
argv = sys.argv[1:]
LIVE = "/var/lib/kube-standin/live.json"


def record(rc, **extra):
    entry = {"host": socket.gethostname(), "tool": "kubectl", "argv": argv, "start": started,
             "end": time.time(), "rc": rc, **extra}
    with open("/var/log/kube-standin.log", "a") as log:
        log.write(json.dumps(entry) + "\n")
    sys.exit(rc)


def files():
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-f"]


def objects(path):
    """(kind namespace/name, text without comments) of each document; no YAML parser on a lab
    host, so the identity is read from the top-level kind and the metadata block."""
    found = []
    for doc in re.split(r"(?m)^---\s*$", open(path).read()):
        text = "\n".join(l for l in doc.splitlines() if l.strip() and not l.startswith("#"))
        if not text:
            continue
        kind = re.search(r"(?m)^kind: *(\S+)", text)
        meta = re.search(r"(?m)^metadata:\n((?:[ ].*\n?)*)", text)
        block = meta[1] if meta else ""
        name = re.search(r"(?m)^  name: *(\S+)", block)
        space = re.search(r"(?m)^  namespace: *(\S+)", block)
        key = f"{kind[1] if kind else '?'} {space[1] if space else ''}/{name[1] if name else '?'}"
        found.append((key, text))
    return found


def live():
    try:
        return json.load(open(LIVE))
    except (OSError, ValueError):
        return {}


def server_side_flags():
    return ("--server-side" in argv and "--field-manager=gpuinfra" in argv
            and "--force-conflicts" in argv)


words = [a for a in argv if not a.startswith("-")]
kubeconfig = next((a.split("=", 1)[1] for a in argv if a.startswith("--kubeconfig=")), None)
if "--kubeconfig" in argv:
    kubeconfig = argv[argv.index("--kubeconfig") + 1]
    words = [w for w in words if w != kubeconfig]
if words[:1] == ["version"]:
    print(json.dumps({"clientVersion": {"gitVersion": "@VERSION@"}}))
    sys.exit(0)
if words[:2] == ["get", "/healthz"]:
    if kubeconfig and os.path.exists(kubeconfig):
        print("ok")
        sys.exit(0)
    print("The connection to the server was refused", file=sys.stderr)
    sys.exit(1)
if words[:2] == ["get", "node"] and "jsonpath" in " ".join(argv):
    # Ready; asked for its kubelet's version too (the upgrade's wait), the version this
    # host's stand-in kubeadm last upgraded to: every node is Ready at once at it.
    try:
        upgraded = open("/var/lib/kube-standin/version").read().strip()
    except OSError:
        upgraded = "@VERSION@"
    print(f"{upgraded} True" if "kubeletVersion" in " ".join(argv) else "True")
    sys.exit(0)
if words[:2] == ["get", "nodes"]:
    print(json.dumps({"items": []}))
    sys.exit(0)
if words[:1] == ["apply"]:
    if not server_side_flags():
        record(0, applied=[])  # a client-side apply (Calico's): recorded, nothing kept
    state = live()
    applied = []
    for path in files():
        for key, text in objects(path):
            state[key] = text
            applied.append(key)
    os.makedirs(os.path.dirname(LIVE), exist_ok=True)
    json.dump(state, open(LIVE, "w"))
    record(0, applied=applied, files=files())
if words[:1] == ["diff"]:
    state = live()
    differs = [key for path in files() for key, text in objects(path) if state.get(key) != text]
    record(1 if differs else 0, differs=differs)
if words[:1] == ["wait"]:
    state = live()
    missing = [key for path in files() for key, _ in objects(path) if key not in state]
    record(1 if missing else 0, missing=missing)
record(0)
'''

KUBELET = r"""#!/bin/sh
# Stand-in kubelet (gpuinfra lab tests): reports its version, otherwise idles.
if [ "$1" = "--version" ]; then echo "Kubernetes @VERSION@"; exit 0; fi
exec sleep infinity
"""

KUBELET_UNIT = """[Unit]
Description=stand-in kubelet (gpuinfra lab tests)
[Service]
ExecStart=/usr/local/bin/kubelet
Restart=always
[Install]
WantedBy=multi-user.target
"""


def install_commands(version: str) -> str:
    """One shell command that installs the stand-in on a host."""
    tag = KubernetesVersion.parse(version).tag
    scripts = {
        "/usr/local/bin/kubeadm": KUBEADM,
        "/usr/local/bin/kubectl": KUBECTL,
        "/usr/local/bin/kubelet": KUBELET,
    }
    parts = ["mkdir -p /var/lib/kube-standin"]
    for path, text in scripts.items():
        body = text.replace("@VERSION@", tag)
        parts.append(f"printf %s {shlex.quote(body)} > {path} && chmod 0755 {path}")
    parts.append(
        f"printf %s {shlex.quote(KUBELET_UNIT)} > /etc/systemd/system/kubelet.service "
        "&& systemctl daemon-reload"
    )
    return " && ".join(parts)


def calls(lab, hosts: list[str]) -> list[dict]:
    """Every recorded stand-in call on these hosts, in start order."""
    entries = []
    for host in hosts:
        text = lab.ssh(host, f"cat {LOG} 2>/dev/null || true").stdout
        entries += [json.loads(line) for line in text.splitlines() if line.strip()]
    return sorted(entries, key=lambda entry: entry["start"])


def issued_secrets(lab, host: str) -> list[str]:
    text = lab.ssh(host, f"cat {ISSUED} 2>/dev/null || true").stdout
    return [line.split(" ", 1)[1] for line in text.splitlines() if " " in line]


# Calls that change a cluster; a converged second apply makes none of them.
CHANGING = {
    ("apply",),
    ("init",),
    ("join",),
    ("token", "create"),
    ("reset",),
    ("upgrade",),
    ("drain",),
    ("delete",),
    ("cordon",),
    ("uncordon",),
}


def words(entry: dict) -> list[str]:
    """A call's arguments without its options (and without the value of --kubeconfig)."""
    argv = list(entry["argv"])
    if "--kubeconfig" in argv:
        del argv[argv.index("--kubeconfig") : argv.index("--kubeconfig") + 2]
    return [a for a in argv if not a.startswith("-")]


def changes(entries: list[dict]) -> list[dict]:
    return [
        e for e in entries if tuple(words(e)[:1]) in CHANGING or tuple(words(e)[:2]) in CHANGING
    ]
