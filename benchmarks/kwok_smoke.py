"""A smoke check of lab/fleet.py without a lab: one etcd and one kube-apiserver of the machine's
builds on 127.0.0.1, kwok with the fleet's flags and stages, and the fleet's Node objects from
the sample inventory. It shows the objects are accepted and kwok makes them Ready with Leases;
it is no measurement of issue 44 (no balancer, one member, one API server, no controllers).

`python -m benchmarks.kwok_smoke --nodes 100 500` (root not needed; ports 23790-23800, 16443).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.control_plane import CLOCK_TICKS, lab_processes
from engine.context import load
from lab import fleet, gobuild

SAMPLE = Path(__file__).resolve().parents[1] / "inventory" / "sample" / "cluster.yml"
ETCD_URL = "http://127.0.0.1:23790"
API_PORT = 16443


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def kubectl(binary: Path, config: Path, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(binary), f"--kubeconfig={config}", *args],
        input=stdin, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args[:2])}: {result.stderr.strip()[-500:]}")
    return result.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kwok_smoke", description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[100])
    args = parser.parse_args(argv)
    loaded = load(SAMPLE)
    kubernetes = gobuild.kubernetes_module(loaded.cluster.versions.kubernetes)
    etcd = gobuild.module("etcd-3.6").binary("server")  # etcd's server command
    kwok = gobuild.module(fleet.KWOK_MODULE).binary("kwok")
    work = Path(tempfile.mkdtemp(prefix="kwok-smoke-"))
    children = []
    try:
        children.append(start([
            str(etcd), f"--data-dir={work}/etcd", f"--listen-client-urls={ETCD_URL}",
            f"--advertise-client-urls={ETCD_URL}", "--listen-peer-urls=http://127.0.0.1:23800",
        ], work / "etcd.log"))  # fmt: skip
        subprocess.run(
            ["openssl", "genrsa", "-out", str(work / "sa.key"), "2048"],
            check=True, capture_output=True,
        )  # fmt: skip
        (work / "tokens.csv").write_text("smoke-token,admin,admin,system:masters\n")
        children.append(start([
            str(kubernetes.binary("kube-apiserver")), f"--etcd-servers={ETCD_URL}",
            f"--secure-port={API_PORT}", "--bind-address=127.0.0.1", f"--cert-dir={work}/certs",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={work}/sa.key",
            f"--service-account-signing-key-file={work}/sa.key",
            f"--token-auth-file={work}/tokens.csv", "--authorization-mode=RBAC",
            "--service-cluster-ip-range=10.96.0.0/16",
        ], work / "apiserver.log"))  # fmt: skip
        config = work / "kubeconfig"
        config.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "smoke",
            "clusters": [{"name": "smoke", "cluster": {
                "server": f"https://127.0.0.1:{API_PORT}", "insecure-skip-tls-verify": True}}],
            "users": [{"name": "admin", "user": {"token": "smoke-token"}}],
            "contexts": [{"name": "smoke", "context": {"cluster": "smoke", "user": "admin"}}],
        }))  # fmt: skip
        kubectl_binary = kubernetes.binary("kubectl")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                kubectl(kubectl_binary, config, "get", "namespace", "kube-node-lease")
                break
            except RuntimeError:
                time.sleep(1)
        stages = work / "kwok.yaml"
        stages.write_text(yaml.safe_dump_all(fleet.stage_documents(), sort_keys=False))
        cidr = str(fleet.pod_cidr(loaded))
        children.append(start(fleet.controller_argv(kwok, stages, config, cidr), work / "kwok.log"))
        done = 0
        for size in args.nodes:
            started = time.monotonic()
            nodes = fleet.fleet_nodes(loaded, range(done + 1, size + 1))
            listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})
            kubectl(kubectl_binary, config, "create", "-f", "-", stdin=listing)
            created = time.monotonic() - started
            while True:
                listed = json.loads(kubectl(kubectl_binary, config, "get", "nodes", "-o", "json"))
                leases = json.loads(
                    kubectl(kubectl_binary, config, "get", "leases", "-n", "kube-node-lease",
                            "-o", "json"))  # fmt: skip
                leased = {item["metadata"]["name"] for item in leases["items"]}
                ready = [n for n in listed["items"]
                         if fleet.node_ready(n) and n["metadata"]["name"] in leased]  # fmt: skip
                if len(ready) >= size or time.monotonic() - started > 300:
                    break
                time.sleep(1)
            print(
                f"{size} nodes: created in {created:.1f} s, {len(ready)} Ready with a Lease "
                f"after {time.monotonic() - started:.1f} s",
                flush=True,
            )
            done = size
            for key, (rss, ticks) in sorted(lab_processes().items()):
                print(f"   {key}: {rss / 2**20:.0f} MiB resident, {ticks / CLOCK_TICKS:.0f} s CPU")
        sample = listed["items"][0]
        print(json.dumps({k: sample[k] for k in ("metadata", "spec")}, indent=1)[:3000])
        print(json.dumps(sample["status"]["conditions"][:1], indent=1))
    finally:
        for child in reversed(children):
            child.terminate()
            child.wait(timeout=20)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
