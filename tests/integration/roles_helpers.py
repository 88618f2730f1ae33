"""Shared steps of the role integration tests: run the CLI, apply roles, read pending changes."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.helpers import GPUINFRA, gpuinfra, self_signed

__all__ = ["GPUINFRA", "gpuinfra"]  # where the role tests have long imported them from


def failed_run(result: subprocess.CompletedProcess[str]) -> str:
    """Why a JSON-reporting command failed, for an assertion message: each host that did not
    end ok or changed, with its error and its failing operations' errors (the report's tail
    alone is another host's notes), then the tail of stderr."""
    try:
        hosts = json.loads(result.stdout)["hosts"]
    except (ValueError, KeyError, TypeError):
        return result.stdout[-4000:] + result.stderr[-3000:]
    lines = [f"exit {result.returncode}"]
    for name, host in hosts.items():
        if host["status"] not in ("ok", "changed"):
            lines.append(f"{name}: {host['status']}: {host.get('error')}")
            lines += [f"  {op['name']}: {op['error']}" for op in host["operations"] if op["error"]]
    return "\n".join(lines) + "\n" + result.stderr[-3000:]


def apply_roles(inventory: Path, roles: str, *extra: str) -> dict:
    arguments = ["apply", str(inventory), "--roles", roles, "--yes", "--format", "json", *extra]
    result = gpuinfra(*arguments)
    assert result.returncode == 0, failed_run(result)
    return json.loads(result.stdout)


def pending(report: dict) -> dict[str, list[str]]:
    """Host -> names of the operations a plan or drift report says would change something."""
    return {
        name: [op["name"] for op in host["operations"] if op["changed"]]
        for name, host in report["hosts"].items()
        if any(op["changed"] for op in host["operations"])
    }


def probe_tcp(lab, host: str, address: str, port: int, timeout: float = 3) -> str:
    """Connect from `host` and say what came back: "open" (a listener answered), "refused" (an
    RST: the packet reached the kernel, the firewall let it through, nothing listens) or
    "timeout" (no answer at all: the firewall dropped it)."""
    script = (
        "import socket,sys\n"
        "s=socket.socket(); s.settimeout(float(sys.argv[3]))\n"
        "try:\n s.connect((sys.argv[1], int(sys.argv[2]))); print('open')\n"
        "except ConnectionRefusedError: print('refused')\n"
        "except (TimeoutError, socket.timeout): print('timeout')\n"
    )
    command = f'python3 -c "{script}" {address} {port} {timeout}'
    return lab.ssh(host, command).stdout.strip()


def eventually(
    check: Callable[[], object], what: str, seconds: float = 90, interval: float = 1
) -> object:
    """Poll until check() returns something truthy; daemons, VRRP and Kubernetes
    settle asynchronously."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {seconds:.0f} s")
        time.sleep(interval)


# A stand-in kube-apiserver: HTTPS with a throwaway self-signed certificate, answering every
# GET (the balancers' and the node-local proxies' /readyz checks included) with the host's
# name. Its port is its argument; `install_standin_cert` first.
STANDIN_CERT = "/tmp/gpuinfra-test-apiserver"
STANDIN_APISERVER = (
    "import http.server, socket, ssl, sys\n"
    "class Handler(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = socket.gethostname().encode() + b'\\n'\n"
    "        self.send_response(200)\n"
    "        self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "server = http.server.ThreadingHTTPServer(('', int(sys.argv[1])), Handler)\n"
    "context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n"
    f"context.load_cert_chain('{STANDIN_CERT}.crt', '{STANDIN_CERT}.key')\n"
    "server.socket = context.wrap_socket(server.socket, server_side=True)\n"
    "server.serve_forever()\n"
)


def ask_https(url: str, attempts: int = 60) -> str:
    """Python for a host: GET `url` (certificate not checked) until it answers, a second apart,
    and print the answer; nothing when it never does."""
    return (
        "import ssl, time, urllib.request\n"
        "context = ssl._create_unverified_context()\n"
        f"for attempt in range({attempts}):\n"
        "    try:\n"
        f"        answer = urllib.request.urlopen({url!r}, timeout=3, context=context).read()\n"
        "        print(answer.decode().strip()); break\n"
        "    except OSError:\n"
        "        time.sleep(1)\n"
    )


def install_standin_cert(lab, host: str) -> None:
    """A throwaway self-signed certificate and key for the stand-in, written on `host` over
    ssh's stdin, 0600."""
    import subprocess

    from toolkit.ssh import ssh_argv

    cert, key = self_signed("test")
    files = {f"{STANDIN_CERT}.crt": cert, f"{STANDIN_CERT}.key": key}
    for path, data in files.items():
        write = f"umask 077 && cat > {path}"
        subprocess.run(ssh_argv(lab.loaded, host) + [write], input=data, check=True)
