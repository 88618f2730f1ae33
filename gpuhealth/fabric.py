"""The optional active fabric check: RDMA write bandwidth between pairs of GPU workers
(`ib_write_bw` from perftest, which the fabric role installs), held against each port's rate
in the fabric settings. Off by default (`gpu_health.fabric_check`); `gpuinfra health fabric`.

Each pair runs one port at a time: the server side on one host, the client on the other
dialling the server's address on that port's network (IPoIB), so the measured path is the
fabric between the two, switches included. NCCL all-reduce bus bandwidth between nodes needs
a multi-node job with GPUs and is not part of this check (see docs/gpu-health.md)."""

from __future__ import annotations

import random
import re
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gpuhealth.results import CheckResult, Verdict
from inventory.model import LoadedCluster
from roles.gpu_health.config import GpuHealthConfig
from toolkit.remote import RemoteResult, RemoteRunner, run_remote
from toolkit.spec import host_config, settings_of

# perftest's default out-of-band port; the fabric role's firewall rule admits it between peers.
PERFTEST_PORT = 18515
# The report's last table row: "#bytes #iterations BW peak BW average MsgRate".
_HEADER = re.compile(r"BW average\[(Gb/sec|MB/sec)\]")


@dataclass(frozen=True)
class PortPlan:
    """One measurement: `client` writes to `server` over the server's port `index`."""

    server: str
    client: str
    device: str
    port: int
    server_address: str
    client_device: str
    client_port: int
    rate_gbps: int


def parse_ib_write_bw(text: str) -> float | None:
    """The average bandwidth in Gb/s from an `ib_write_bw` report (None: no result row). With
    `--report_gbits` the columns are Gb/sec; without, MB/sec (10^6 bytes), converted here."""
    unit = None
    for line in text.splitlines():
        header = _HEADER.search(line)
        if header:
            unit = header.group(1)
            continue
        fields = line.split()
        if unit and len(fields) >= 4 and fields[0].isdigit():
            try:
                average = float(fields[3])
            except ValueError:
                return None
            return average if unit == "Gb/sec" else average * 8 / 1000
    return None


def pairs_of(hosts: list[str], rng: random.Random) -> list[tuple[str, str]]:
    """Random disjoint (server, client) pairs covering every host; with an odd count the last
    host is the client of the first pair's server too, so no host goes untested."""
    shuffled = list(hosts)
    rng.shuffle(shuffled)
    pairs = [(shuffled[i], shuffled[i + 1]) for i in range(0, len(shuffled) - 1, 2)]
    if len(shuffled) % 2 and pairs:
        pairs.append((pairs[0][0], shuffled[-1]))
    return pairs


def plans_for(loaded: LoadedCluster, pairs: list[tuple[str, str]]) -> list[PortPlan]:
    """One measurement per port of the server that the client has a port of the same index
    for (rail to rail: ib0 to ib0, ib1 to ib1)."""
    plans = []
    for server, client in pairs:
        served = settings_of(loaded, server, "fabric")
        dialling = settings_of(loaded, client, "fabric")
        for index, port in enumerate(served.ports):
            if index >= len(dialling.ports):
                break
            mine = dialling.ports[index]
            plans.append(
                PortPlan(
                    server,
                    client,
                    port.device,
                    port.port,
                    str(port.address.ip),
                    mine.device,
                    mine.port,
                    min(served.rate_gbps, dialling.rate_gbps),
                )
            )
    return plans


def perftest_command(device: str, port: int, cfg: GpuHealthConfig, server: str | None) -> str:
    """ib_write_bw's command line: the server side without an address, the client with one."""
    argv = [
        "ib_write_bw",
        "-d",
        device,
        "-i",
        str(port),
        "-F",  # no CPU frequency warning: a busy node is what it is
        "--report_gbits",
        "-s",
        str(cfg.fabric_message_bytes),
        "-D",
        str(cfg.fabric_duration_s),
        "-p",
        str(PERFTEST_PORT),
    ]
    if server is not None:
        argv.append(server)
    return " ".join(shlex.quote(arg) for arg in argv)


def judge(plan: PortPlan, result: RemoteResult, cfg: GpuHealthConfig) -> CheckResult:
    """The verdict of one measurement against the port's rate from the fabric settings."""
    degraded = plan.rate_gbps * cfg.fabric_degraded_fraction
    failed = plan.rate_gbps * cfg.fabric_failed_fraction
    threshold = f">= {degraded:g} Gb/s ({cfg.fabric_degraded_fraction:.0%} of {plan.rate_gbps})"
    name = f"{plan.client} -> {plan.server} {plan.device}:{plan.port}"
    measured = parse_ib_write_bw(result.stdout) if result.ok else None
    if measured is None:
        why = "timed out" if result.timed_out else f"exit {result.exit_code}"
        return CheckResult(
            "fabric",
            Verdict.failed,
            "no result",
            threshold,
            detail=f"{name}: ib_write_bw gave no bandwidth ({why}): {result.tail()}",
        )
    if measured < failed:
        verdict = Verdict.failed
    elif measured < degraded:
        verdict = Verdict.degraded
    else:
        verdict = Verdict.ok
    return CheckResult(
        "fabric",
        verdict,
        f"{measured:g} Gb/s",
        threshold,
        value=measured,
        unit="Gb/s",
        detail=f"{name}: RDMA write, {cfg.fabric_message_bytes} B messages",
    )


def measure(
    loaded: LoadedCluster,
    plan: PortPlan,
    cfg: GpuHealthConfig,
    ssh: RemoteRunner = run_remote,
    sleep: Callable[[float], None] = time.sleep,
) -> CheckResult:
    """Start the server side, give it a moment to listen, run the client, judge the client."""
    timeout = cfg.fabric_duration_s + 60
    server_command = perftest_command(plan.device, plan.port, cfg, None)
    client_command = perftest_command(
        plan.client_device, plan.client_port, cfg, plan.server_address
    )
    with ThreadPoolExecutor(max_workers=1) as pool:
        serving = pool.submit(ssh, loaded, plan.server, server_command, timeout=timeout)
        sleep(2)
        result = ssh(loaded, plan.client, client_command, timeout=timeout)
        serving.result()
    return judge(plan, result, cfg)


def run_fabric_check(
    loaded: LoadedCluster,
    hosts: list[str],
    seed: int | None = None,
    ssh: RemoteRunner = run_remote,
    sleep: Callable[[float], None] = time.sleep,
) -> list[CheckResult]:
    """Every fabric port of `hosts`, in random pairs; the pairs run one after another so no
    two measurements share a switch port's bandwidth. The thresholds are the first host's
    gpu_health settings (group_vars set them alike for a fleet)."""
    if not hosts:
        return []
    cfg = host_config(loaded, hosts[0], "gpu_health", GpuHealthConfig)
    if not cfg.fabric_check:
        return [
            CheckResult(
                "fabric",
                Verdict.skipped,
                "not run",
                "",
                detail="gpu_health.fabric_check is off (the pair check is opt-in)",
            )
        ]
    plans = plans_for(loaded, pairs_of(hosts, random.Random(seed)))
    if not plans:
        return [
            CheckResult(
                "fabric", Verdict.skipped, "not run", "", detail="no pair with fabric ports"
            )
        ]
    return [measure(loaded, plan, cfg, ssh, sleep) for plan in plans]
