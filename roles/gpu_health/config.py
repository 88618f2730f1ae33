"""Defaults of the gpu_health role; group_vars/host vars under `gpu_health:` override them.

Two readings of them live here too, since both the role's manifests and its agent (gpuhealth/)
need them and the role imports nothing from the agent: the fleet-wide settings and the number
of nodes a cordon budget allows."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inventory.grammar import ImageRef, Namespace, PlainPath, QualifiedName, Words
from inventory.model import LoadedCluster


class GpuHealthConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Any volatile (since last reset) uncorrectable ECC error means data in flight was lost.
    ecc_volatile_uncorrectable_max: int = Field(0, ge=0)
    # Aggregate (lifetime) errors may predate a successful row remap: worth a look, not a drain.
    ecc_aggregate_uncorrectable_max: int = Field(0, ge=0)
    # A narrower PCIe link still computes correctly, only host transfers slow: fix at maintenance.
    pcie_downgrade_verdict: Literal["degraded", "failed"] = "degraded"
    # Every NVLink that the GPU reports as present must be up: NCCL rings route around nothing.
    nvlink_links_down_max: int = Field(0, ge=0)

    # 8192^3 BF16 GEMMs: big enough to saturate tensor cores, small enough to run in seconds.
    matmul_size: int = Field(8192, ge=1024)
    # ~3 s of back-to-back GEMMs per H100 (1.1 TFLOP each): past the clock ramp to the steady,
    # power-capped clocks that real training sees (a cold GPU's first GEMMs flatter it).
    matmul_iterations: int = Field(2000, ge=5)
    # cuBLAS reaches ~70-80% of the datasheet dense peak on H100 SXM at the 700 W cap (the
    # datasheet assumes max boost clock); below 60% the GPU is a straggler for synchronous jobs.
    matmul_degraded_fraction: float = Field(0.60, gt=0, le=1)
    # Below 30% of peak something is broken (clocks pinned low, a sick SM array), not just slow.
    matmul_failed_fraction: float = Field(0.30, gt=0, le=1)
    # Device-to-device copies of 2 GiB dwarf the L2 cache (50 MiB on H100), so HBM is measured.
    membw_size_mib: int = Field(2048, ge=256)
    # A plain copy kernel reaches ~80-90% of HBM's datasheet bandwidth; 70% leaves noise room.
    membw_degraded_fraction: float = Field(0.70, gt=0, le=1)
    membw_failed_fraction: float = Field(0.35, gt=0, le=1)
    # nccl-tests reach peak bus bandwidth only with large messages (hundreds of MiB and up).
    allreduce_size_mib: int = Field(512, ge=16)
    # 8x H100 reach ~480 GB/s bus bandwidth over NVLink (nccl-tests#212); 70% is a sick link.
    allreduce_degraded_fraction: float = Field(0.70, gt=0, le=1)
    allreduce_failed_fraction: float = Field(0.35, gt=0, le=1)
    # The pairwise RDMA check between GPU workers (`gpuinfra health fabric`): opt-in, since it
    # loads the fabric's links for its duration and needs the fabric role's ports and tools.
    fabric_check: bool = False
    # ib_write_bw reaches ~98% of an HDR port's 200 Gb/s with large messages; below 90% a link
    # trained down or a cable is marginal. Measured against fabric.rate_gbps of the pair.
    fabric_degraded_fraction: float = Field(0.90, gt=0, le=1)
    # Below half the rate the link is broken (HDR trained to 100 or lower, a bad rail).
    fabric_failed_fraction: float = Field(0.50, gt=0, le=1)
    # 1 MiB messages: past the size where RDMA write bandwidth plateaus on HDR.
    fabric_message_bytes: int = Field(1048576, ge=65536)
    # Seconds per port: long enough to average out the ramp, short for a fleet of pairs.
    fabric_duration_s: int = Field(5, ge=1, le=600)
    # DCGM diag level 1 takes seconds, 2 about two minutes, 3 about fifteen (NVIDIA's docs).
    dcgm_level: int = Field(1, ge=1, le=4)

    # The reference design never acts on more than a bounded share of the fleet at once.
    cordon_budget: str = Field("10%", pattern=r"^(\d+%|\d+)$")
    # SSH fan-out width: each session mostly waits on the remote GPUs, not on this machine.
    fleet_parallel: int = Field(32, ge=1, le=256)
    # Active tests plus DCGM level 3 can take ~15 minutes; a hung node must not block the run.
    fleet_timeout_s: int = Field(1200, ge=30)
    # What runs on each sampled node; JSON so verdicts are parsed, never scraped from a table.
    remote_command: Words = "gpuinfra health run --format json"
    # Kubernetes node names: kubelet registers with the short host name unless told otherwise.
    node_name: Literal["host", "fqdn"] = "host"

    # Image with gpuinfra, kubectl and PyTorch (for the active tests); built from this repository.
    image: ImageRef = "ghcr.io/gpuinfra/gpu-health:0.1.0"
    # Its own namespace so RBAC and quotas for node-patching pods stay separate from workloads.
    namespace: Namespace = "gpu-health"
    # Four times a day, off the hour, so it does not coincide with hourly batch starts.
    cronjob_schedule: Words = "17 */6 * * *"
    # Every GPU worker gets a full check about once a month: shorter than a training campaign, so
    # a GPU that went bad between jobs (row remaps piling up, a link trained down) is found
    # before the next long run lands on it, for minutes of GPU time per node a month.
    retest_interval_days: int = Field(30, ge=1, le=365)
    # Nodes per CronJob run, each a different idle node: unset, derived from the GPU workers and
    # the schedule's runs per interval (sampling.py); set, that many whatever the fleet's size.
    cronjob_parallelism: int | None = Field(None, ge=1)
    # Passive checks (ECC, Xid, throttling, links) are cheap: every five minutes on every node.
    passive_interval_s: int = Field(300, ge=30)
    # Debian/Ubuntu prometheus-node-exporter's textfile collector directory.
    textfile_dir: PlainPath = "/var/lib/prometheus/node-exporter"
    # The extended resource the NVIDIA device plugin advertises; the CronJob asks for all of them.
    gpu_resource: QualifiedName = "nvidia.com/gpu"


def cluster_config(loaded: LoadedCluster) -> GpuHealthConfig:
    """The settings that apply fleet-wide (fleet runs, in-cluster manifests): group vars for all
    hosts, then for gpu_worker; per-host vars only reach that host's own checks."""
    merged: dict[str, Any] = {}
    for group in ("all", "gpu_worker"):
        merged.update(loaded.cluster.group_vars.get(group, {}).get("gpu_health", {}))
    return GpuHealthConfig.model_validate(merged)


def parse_budget(budget: str, gpu_workers: int) -> int:
    """`10%` of the GPU workers, rounded down but at least 1; or a plain number of nodes."""
    budget = budget.strip()
    if budget.endswith("%"):
        share = float(budget[:-1])
        if not 0 <= share <= 100:
            raise ValueError(f"budget {budget}: a share must be between 0% and 100%")
        return max(1, math.floor(gpu_workers * share / 100))
    if not budget.isdigit():
        raise ValueError(f"budget {budget!r}: give a share like 10% or a number of nodes")
    return int(budget)
