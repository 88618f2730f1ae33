"""The monitoring role's deploys: node exporter on every host, Prometheus and Alertmanager on
its group."""

from __future__ import annotations

import base64
from io import BytesIO, StringIO
from pathlib import Path

from cryptography import x509
from pyinfra.api import FunctionCommand, OperationError, StringCommand, deploy, operation
from pyinfra.operations import apt, files, server

from inventory.topology import NODE_EXPORTER_PORT
from roles.monitoring.files import (
    ALERT_RULES,
    ALERTMANAGER_CONFIG,
    ALERTMANAGER_DEFAULTS,
    ALERTMANAGER_PORT,
    NODE_EXPORTER_DEFAULTS,
    PROMETHEUS_CONFIG,
    PROMETHEUS_DEFAULTS,
    node_exporter_files,
    prometheus_files,
    textfile_dir,
)
from roles.monitoring.kubernetes import (
    CA_STATE,
    CERT_STATE,
    KEY_STATE,
    SIGN_WAIT_S,
    USER,
    metrics_access,
    public_key,
    request_pem,
    signing_command,
)
from roles.monitoring.targets import CLIENT_CERT, CLUSTER_CA, CREDENTIALS_DIR, PROMETHEUS_PORT
from toolkit.operations import put_file, restart_if_running, service_running, wait_for
from toolkit.spec import HostContext
from toolkit.statefiles import write_secret_atomically

ALERTMANAGER_UNIT = "prometheus-alertmanager"


def _sign(state, host, signer: str, kubeconfig: str, cluster_ca: str, state_dir: str):
    folder = Path(state_dir)
    key_pem = (folder / KEY_STATE).read_text()  # the apply kept it while preparing
    first = state.inventory.get_host(signer)
    if first is None or first not in state.active_hosts:
        raise OperationError(
            f"{signer} (the first control-plane node) failed or is not in this run: Prometheus' "
            "Kubernetes certificate is signed there; include it (--limit) and fix it first"
        )
    request = request_pem(key_pem)
    ok, output = first.run_shell_command(
        StringCommand(signing_command(request, kubeconfig)),
        print_output=False,
        print_input=False,
        _timeout=SIGN_WAIT_S + 60,
    )
    printed = output.stdout.split()
    if not ok or not printed:
        said = " | ".join(line.line for line in output if line.line.strip())[-300:]
        raise OperationError(f"{signer}: no certificate for {USER}: {said}")
    cert_pem = base64.b64decode(printed[-1]).decode()
    if public_key(x509.load_pem_x509_certificate(cert_pem.encode())) != public_key(key_pem):
        raise OperationError(f"{signer}: the certificate signed for {USER} is not for its key")
    buffer = BytesIO()
    if not first.get_file(cluster_ca, buffer, print_output=False, print_input=False):
        raise OperationError(f"{signer}: could not read {cluster_ca}")
    ca_pem = buffer.getvalue().decode()
    for relative, text in ((CERT_STATE, cert_pem), (CA_STATE, ca_pem)):
        (folder / relative).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_secret_atomically(folder / relative, text.encode())
    ok, _ = host.run_shell_command(
        StringCommand(f"install -d -m 0755 {CREDENTIALS_DIR}"), print_output=False
    )
    for path, text in ((CLIENT_CERT, cert_pem), (CLUSTER_CA, ca_pem)):
        if not ok or not host.put_file(StringIO(text), path, print_output=False):
            raise OperationError(f"could not write {path}")
    # As the managed files that the next apply writes them as (ManagedFile's defaults).
    paths = f"{CLIENT_CERT} {CLUSTER_CA}"
    ok, _ = host.run_shell_command(
        StringCommand(f"chown root:root {paths} && chmod 0644 {paths}"), print_output=False
    )
    if not ok:
        raise OperationError(f"could not set the owner and mode of {paths}")
    return True


@operation()
def certificate_signed(signer: str, kubeconfig: str, cluster_ca: str, state_dir: str):
    """Prometheus' client certificate signed on `signer` and written here and to the state (see
    the module's docstring); only where no kept certificate serves. The key is read from the
    state when it runs: never an operation's argument."""
    yield FunctionCommand(_sign, (signer, kubeconfig, cluster_ca, state_dir), {})


@deploy("Node exporter")
def apply_node_exporter(ctx: HostContext) -> None:
    apt.packages(
        name="Install node exporter", packages=["prometheus-node-exporter"], no_recommends=True
    )
    # gpu_health's timer writes its .prom file here; node exporter only reads it.
    files.directory(
        name="Create the textfile collector directory",
        path=textfile_dir(ctx),
        user="root",
        group="root",
        mode="0755",
    )
    written = {f.path: put_file(f) for f in node_exporter_files(ctx)}
    service_running(name="Run node exporter", unit="prometheus-node-exporter")
    changed = written[NODE_EXPORTER_DEFAULTS].did_change
    # Arguments are only read at start: a reload would keep the old collectors.
    restart_if_running(
        name="Restart node exporter for new arguments",
        unit="prometheus-node-exporter",
        _if=changed,
    )
    server.shell(
        name="Wait for node exporter to serve metrics",
        commands=[
            wait_for(f"curl -fsS -o /dev/null http://127.0.0.1:{NODE_EXPORTER_PORT}/metrics")
        ],
        _if=changed,
    )


@deploy("Prometheus")
def apply_prometheus(ctx: HostContext) -> None:
    # Alertmanager's package first too: its configuration is checked with its amtool.
    apt.packages(
        name="Install Prometheus and Alertmanager",
        packages=["prometheus", "prometheus-alertmanager"],
        no_recommends=True,
    )
    managed = prometheus_files(ctx)
    access = metrics_access(ctx.loaded)
    if access is not None and CLIENT_CERT not in {f.path for f in managed}:
        # No kept certificate serves (credential_files). Before the configuration, whose
        # check needs the files it names.
        certificate_signed(
            name="Have Prometheus' Kubernetes client certificate signed (on the first "
            "control-plane node, through the certificates API)",
            signer=access.signer,
            kubeconfig=access.admin_kubeconfig,
            cluster_ca=access.cluster_ca,
            state_dir=str(ctx.loaded.state_dir),
        )
    # Rules are written (and checked) before the configuration that loads them.
    written = {f.path: put_file(f) for f in managed}
    arguments, rules, config = (
        written[PROMETHEUS_DEFAULTS],
        written[ALERT_RULES],
        written[PROMETHEUS_CONFIG],
    )
    service_running(name="Run Prometheus", unit="prometheus")
    # Retention and listen address are flags: only a restart applies them. Scrape targets and
    # rules are re-read on SIGHUP, which keeps the in-memory head block and running queries.
    restart_if_running(
        name="Restart Prometheus for new arguments",
        unit="prometheus",
        _if=arguments.did_change,
    )
    restart_if_running(
        name="Reload Prometheus for new targets or rules",
        unit="prometheus",
        reload=True,
        _if=lambda: not arguments.did_change() and (rules.did_change() or config.did_change()),
    )
    server.shell(
        name="Wait for Prometheus to be ready",
        commands=[wait_for(f"curl -fsS -o /dev/null http://127.0.0.1:{PROMETHEUS_PORT}/-/ready")],
        _if=lambda: arguments.did_change() or rules.did_change() or config.did_change(),
    )
    alertmanager_arguments, routes = written[ALERTMANAGER_DEFAULTS], written[ALERTMANAGER_CONFIG]
    service_running(name="Run Alertmanager", unit=ALERTMANAGER_UNIT)
    restart_if_running(
        name="Restart Alertmanager for new arguments",
        unit=ALERTMANAGER_UNIT,
        _if=alertmanager_arguments.did_change,
    )
    # Routes and receivers are re-read on SIGHUP, keeping the alerts it holds.
    restart_if_running(
        name="Reload Alertmanager for new routes",
        unit=ALERTMANAGER_UNIT,
        reload=True,
        _if=lambda: not alertmanager_arguments.did_change() and routes.did_change(),
    )
    server.shell(
        name="Wait for Alertmanager to be ready",
        commands=[wait_for(f"curl -fsS -o /dev/null http://127.0.0.1:{ALERTMANAGER_PORT}/-/ready")],
        _if=lambda: alertmanager_arguments.did_change() or routes.did_change(),
    )
