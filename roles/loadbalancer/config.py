"""Defaults of the loadbalancer role; group_vars/host vars under `loadbalancer:` override them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from inventory.grammar import Duration, Interface, Word


class LoadBalancerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # "readyz": GET /readyz over TLS (anonymous by default in kube-apiserver): an API server
    # takes traffic only once it can serve it (its RBAC loaded, etcd reached), and leaves the
    # rotation as soon as its shutdown begins, while it still serves during its shutdown delay
    # (roles/kubernetes/kubeadm.py): an upgrade's restarts cost clients no error. "tcp": a
    # connect per check, which sees only a dead or unreachable API server.
    health_check: Literal["tcp", "readyz"] = "readyz"
    # Check every 2 s, 3 failures to mark DOWN, 2 successes to mark UP: a dead API server is out
    # of rotation in ~6 s, and one flap does not bounce it (Kubespray's HAProxy uses 3 s/3/2).
    check_interval: Duration = "2s"
    check_fall: int = Field(3, ge=1)
    check_rise: int = Field(2, ge=1)
    # kubectl watches and kubelet's API connections live for hours; a short client/server timeout
    # would cut every watch and cause reconnect storms against the API servers.
    tunnel_timeout: Duration = "4h"
    connect_timeout: Duration = "5s"
    # Concurrent connections per balancer: kubelets, kube-proxies and controllers hold two or
    # three each, so 8000 covers ~2500 nodes. HAProxy needs two descriptors per connection and
    # refuses to (re)load when it cannot raise its limit to that (lab containers cap it at 20000).
    maxconn: int = Field(8000, ge=100)
    # Interface keepalived sends VRRP on and adds the virtual address to: the lab's and most
    # images' first NIC; set it per group or host where the node network is on bond0, ens5...
    vrrp_interface: Interface = "eth0"
    # VRRP router id, unique per layer-2 segment; None derives it from the virtual address so two
    # clusters on one segment differ without anyone choosing numbers.
    virtual_router_id: int | None = Field(None, ge=1, le=255)
    # VRRP PASS authentication (8 characters used) travels in clear in every advertisement on
    # the segment: it keeps another cluster's keepalived from joining by mistake. None: a random
    # one that apply generates once and keeps in the cluster's .state/ (0600), never one that can
    # be worked out from the inventory.
    vrrp_password: Word | None = Field(None, min_length=1, max_length=8)
    # Advertise every second: the backup takes the address ~3 s after the master goes silent.
    vrrp_advert_interval: int = Field(1, ge=1, le=255)
