"""The order of make test's integration modules (tests/integration/conftest.py): own-lab modules
before the session lab is booted, the Kubernetes lab's modules together."""

from __future__ import annotations

from tests.helpers import lab_module_order


def test_own_lab_modules_run_before_the_session_labs_and_the_kubernetes_ones_together():
    collected = [
        "drift_job",
        "drift_fast",
        "engine",
        "etcd_hardening",
        "kubernetes",
        "lab",
        "wheel",
    ]
    shared = {"drift_fast", "engine", "lab"}
    kubernetes = {"drift_job", "kubernetes"}
    assert lab_module_order(collected, shared, kubernetes) == [
        "drift_job",
        "kubernetes",
        "etcd_hardening",
        "wheel",
        "drift_fast",
        "engine",
        "lab",
    ]
    # Control: with no module on the session lab and none on the Kubernetes one, the collected
    # order stands.
    assert lab_module_order(collected, set(), set()) == collected
