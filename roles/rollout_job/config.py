"""Defaults of the rollout Job; `group_vars.all.rollout_job` in the inventory overrides them."""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, ConfigDict, Field

from inventory.grammar import ImageRef, JobNamespace, Quantity


class RolloutJobConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # `gpuinfra apply --job` (docs/fleet-jobs.md): worker groups admit the rollout key as root
    # from the Job's nodes. Off: nothing is written and no fact is asked, so an inventory
    # without it plans, applies and drifts as before the Job existed.
    enabled: bool = False
    # The Kubernetes nodes the Job's pods run on (nodeAffinity on kubernetes.io/hostname): the
    # workers admit the rollout key only from these nodes and their pods.
    nodes: tuple[str, ...] = ()
    # More sources the key is admitted from: a Job that runs in another cluster (its nodes').
    sources: tuple[ipaddress.IPv4Network, ...] = ()
    # An image with gpuinfra installed (`pip install .` of this repository); pin it by digest.
    image: ImageRef = "gpuinfra:0.1.0"
    # Pods, each rolling its share of the hosts; the join rate and the budget are fleet-wide
    # whatever the count (toolkit/pacing.py SlotPacer, engine/fleetgate.py).
    shards: int = Field(2, ge=1, le=256)
    # Hosts being applied at once, all shards together: the fleet's unavailability budget,
    # as --batch is for a local apply.
    budget: int = Field(10, ge=1)
    # Past this share of failed hosts the ledger stops the rollout; None: never stops.
    fail_percent: float | None = Field(None, ge=0, le=100)
    namespace: JobNamespace = "gpuinfra"
    # Joins are paced at kubernetes.join_rate (5/10s): 7,500 joins take 4.2 h for any shard
    # count (docs/design/fleet-jobs.md section 6), so the default allows a few hundred hosts.
    deadline_seconds: int = Field(4 * 3600, ge=300)
    # One core per shard: a gpuinfra process is single-threaded (gevent).
    cpu: Quantity = "1"
    # A pyinfra run holds every host of its step's facts; 1 GiB fits a budget of a few dozen.
    memory: Quantity = "1Gi"
