"""Defaults of the drift job; `group_vars.all.drift_job` in the inventory overrides them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DriftJobConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # An image with gpuinfra installed (`pip install .` of this repository); pin it by digest.
    image: str = "gpuinfra:0.1.0"
    # 200 is the largest lab measured (docs/benchmarks): each shard stays on measured ground.
    hosts_per_shard: int = Field(200, ge=1)
    # None: as many shards as it takes to keep each at hosts_per_shard or fewer.
    shards: int | None = Field(None, ge=1)
    namespace: str = "gpuinfra"
    # Holds cluster.yml, whose ssh.key and ssh.known_hosts point under /etc/gpuinfra/ssh.
    inventory_configmap: str = "gpuinfra-inventory"
    # Holds id_ed25519 and known_hosts: host keys stay checked inside the cluster too.
    ssh_secret: str = "gpuinfra-ssh"
    # A 200-host shard took under a minute on a loaded 2-core machine; ten is a hung runner.
    deadline_seconds: int = Field(600, ge=60)
    # One core per shard: a gpuinfra process is single-threaded (gevent).
    cpu: str = "1"
    # Measured controller peaks stay under 200 MiB for 200 hosts; twice that for headroom.
    memory: str = "512Mi"
