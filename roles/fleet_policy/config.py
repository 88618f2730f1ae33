"""Defaults of the fleet_policy role: cluster-wide, so only `group_vars.all.fleet_policy` sets
them (one set of Kubernetes objects serves the whole cluster)."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inventory.grammar import ImageRef, LabelValue, PlainPath, QualifiedName, Quantity
from inventory.model import HostName

# What the API server allows a queuing configuration's shuffle sharding (its shufflesharding
# package's MaxHashBits).
MAX_HAND_ENTROPY_BITS = 60


class BalloonPool(BaseModel):
    """Pause pods that hold capacity until real work preempts them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # How many nodes' worth (or slices) of capacity to keep warm; 0 keeps the pool declared.
    replicas: int = Field(ge=0)
    # A pause pod uses nothing; what it requests is the capacity it reserves.
    cpu: Quantity = "1"
    memory: Quantity = "1Gi"
    # GPUs per balloon: a whole node's GPUs keep a whole node warm for a multi-node job.
    gpus: int = Field(0, ge=0, le=16)
    # The team whose nodes it warms: selects them and tolerates their taint. None: shared nodes.
    team: str | None = None
    # Extra node labels to land on (e.g. a GPU model), on top of the team's.
    node_selector: dict[QualifiedName, LabelValue] = Field(default_factory=dict)


class FlowControl(BaseModel):
    """API Priority and Fairness for gpuinfra's own in-cluster clients (flowcontrol v1): one
    Limited priority level that a fleet operation's requests queue in, so a thousand GPU nodes'
    health pods or a rollout's shards never take the seats of kubelets and controllers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Numerically above every system schema Kubernetes installs (exempt 1, probes 2,
    # system-leader-election 100, endpoint-controller 150, workload-leader-election 200,
    # system-node-high 400, system-nodes 500, kube-controller-manager and kube-scheduler 800,
    # kube-system-service-accounts 900), so node heartbeats and controllers are never ours;
    # below service-accounts (9000), which would otherwise put our accounts in workload-low;
    # off 1000, the precedence an operator's schema gets when it sets none, so no tie.
    matching_precedence: int = Field(1500, gt=900, lt=9000)
    # global-default's share (20): about 20/265 of the server's seats with the suggested levels
    # (45 of the 600 a default API server has), ample for a few accounts' small requests and
    # well below workload-low (100), node-high (40) and workload-high (40).
    nominal_concurrency_shares: int = Field(20, ge=1)
    # Fleet operations are occasional: half the seats go to the other levels while we are idle
    # (global-default's and workload-high's value), the other half stays ready for a rollout.
    lendable_percent: int = Field(50, ge=0, le=100)
    # Never more than our own seats, even from idle levels: lent seats return only as our
    # requests finish, so borrowing could hold what kubelets and controllers need back.
    borrowing_limit_percent: int = Field(0, ge=0)
    # A handful of flows (one per account, ByUser): 16 queues keep them apart (leader-election's
    # count, the smallest of the suggested levels; workload levels' 128 serve many users).
    queues: int = Field(16, ge=1)
    # 4 queues dealt per flow (leader-election's hand): with 16 queues two of our accounts
    # rarely share all four, and its 16 bits are well within the API server's 60 (below).
    hand_size: int = Field(4, ge=1)
    # Every suggested level's queue length: past 50 waiting requests a flow gets 429 and
    # client-go retries after the server's Retry-After, instead of queueing without bound.
    queue_length_limit: int = Field(50, ge=1)

    @model_validator(mode="after")
    def _hand_fits(self) -> FlowControl:
        # The API server's own checks on a queuing configuration (ValidatePriorityLevel...):
        # a hand no larger than the deck, and shuffle sharding's entropy at most 60 bits.
        if self.hand_size > self.queues:
            raise ValueError("hand_size must not exceed queues")
        if math.ceil(math.log2(self.queues) * self.hand_size) > MAX_HAND_ENTROPY_BITS:
            raise ValueError(f"queues and hand_size need more than {MAX_HAND_ENTROPY_BITS} bits")
        return self


class FleetPolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Add-ons of the whole fleet (device plugin, DCGM exporter, balloons) live together here,
    # away from team namespaces, so the team admission policy never applies to them.
    namespace: HostName = "gpuinfra-system"

    # Below zero so any real pod (priority 0 by default) preempts a balloon; above -10, the
    # cluster autoscaler's --expendable-pods-priority-cutoff, so a pending balloon still asks
    # for a node (below the cutoff the autoscaler ignores it and capacity is never kept warm).
    balloon_priority: int = Field(-5, gt=-10, lt=0)
    # Pool name -> pool; the name becomes the Deployment's (balloon-<name>): a DNS label.
    balloons: dict[HostName, BalloonPool] = Field(default_factory=dict)
    # The pause image kubeadm 1.35 itself pulls for pod sandboxes: already on every node.
    pause_image: ImageRef = "registry.k8s.io/pause:3.10.1"

    # NVIDIA's device plugin advertises nvidia.com/gpu; v0.17.0 supports driver R550 and CDI.
    device_plugin_image: ImageRef = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"
    # DCGM 3.3.9 embedded (no host engine needed) on the CUDA 12 / Ubuntu 22.04 base.
    dcgm_exporter_image: ImageRef = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04"
    # The DCGM series kept at scrape time; everything else the default counter set exports
    # (encoder/decoder use, vGPU licences, clocks of memory, energy counters, PCIe bytes)
    # is dropped. Utilisation alone says little, so tensor and DRAM activity stay, as do the
    # error counters the health alerts need and memory use for capacity planning.
    dcgm_keep_metrics: list[str] = Field(
        default_factory=lambda: [
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_FB_FREE",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_SM_CLOCK",
            "DCGM_FI_DEV_XID_ERRORS",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_PROF_DRAM_ACTIVE",
        ]
    )
    # The priority level and flow schema of gpuinfra's own API clients (flow-control.yaml).
    flow_control: FlowControl = Field(default_factory=FlowControl)
    # Where the control plane nodes keep the scheduler's configuration (kubeadm mounts it).
    scheduler_config_path: PlainPath = "/etc/kubernetes/gpuinfra/kube-scheduler-config.yaml"
