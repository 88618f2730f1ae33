"""Defaults of the drift job; `group_vars.all.drift_job` in the inventory overrides them."""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, ConfigDict, Field

from inventory.grammar import DnsName, ImageRef, JobNamespace, LoginName, Quantity


class DriftJobConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # `gpuinfra drift --job` (docs/fleet-jobs.md): every host gets the forced-command user, its
    # key and the probe each apply records. Off: none of it is written and no fact is asked, so
    # an inventory without it plans, applies and drifts as before the Job existed.
    enabled: bool = False
    # With enabled off: remove what an earlier enabled apply installed (the user, the key, the
    # sshd drop-in, sudoers, the wrapper and the probe). A removal asks about those paths on
    # every host, which is why it is a setting of its own and not what "off" does.
    remove: bool = False
    # The Kubernetes nodes the Job's pods run on (nodeAffinity on kubernetes.io/hostname): the
    # hosts' keys admit the key only from these nodes and their pods.
    nodes: tuple[str, ...] = ()
    # More sources the key is admitted from: a Job that runs in another cluster (its nodes').
    sources: tuple[ipaddress.IPv4Network, ...] = ()
    # ssh clients at once per shard: 39 MiB + 6.1 MiB each (docs/benchmarks/results.md), so 64
    # fits the 512Mi below; 200 would need about 1.25 GiB.
    parallel: int = Field(64, ge=1, le=1000)
    # The forced-command user: runs only the wrapper, through sudo, with no arguments.
    user: LoginName = "gpuinfra-drift"

    # An image with gpuinfra installed (`pip install .` of this repository); pin it by digest.
    image: ImageRef = "gpuinfra:0.1.0"
    # 200 is the largest lab measured (docs/benchmarks): each shard stays on measured ground.
    hosts_per_shard: int = Field(200, ge=1)
    # None: as many shards as it takes to keep each at hosts_per_shard or fewer.
    shards: int | None = Field(None, ge=1)
    namespace: JobNamespace = "gpuinfra"
    # Holds cluster.yml, whose ssh.key and ssh.known_hosts point under /etc/gpuinfra/ssh.
    inventory_configmap: DnsName = "gpuinfra-inventory"
    # Holds id_ed25519 and known_hosts: host keys stay checked inside the cluster too.
    ssh_secret: DnsName = "gpuinfra-ssh"
    # A 200-host shard took under a minute on a loaded 2-core machine; ten is a hung runner.
    deadline_seconds: int = Field(600, ge=60)
    # One core per shard: a gpuinfra process is single-threaded (gevent).
    cpu: Quantity = "1"
    # Measured controller peaks stay under 200 MiB for 200 hosts; twice that for headroom.
    memory: Quantity = "512Mi"
