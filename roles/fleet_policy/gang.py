"""Gang scheduling: the scheduler-plugins release that matches the cluster's Kubernetes minor."""

from __future__ import annotations

# scheduler-plugins release v0.X is built against Kubernetes v1.X (its README's compatibility
# table); the patch release pinned is the latest listed there for each minor.
SCHEDULER_PLUGINS_RELEASES = {
    "1.30": "v0.30.12",
    "1.31": "v0.31.8",
    "1.32": "v0.32.7",
}
SCHEDULER_PLUGINS_IMAGE = "registry.k8s.io/scheduler-plugins/kube-scheduler"
# The label a pod names its PodGroup with (scheduling.x-k8s.io/v1alpha1).
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


class UnsupportedKubernetes(ValueError):
    """No scheduler-plugins release is pinned for this Kubernetes minor."""


def kubernetes_minor(version: str) -> str:
    major, minor, *_ = version.removeprefix("v").split(".")
    return f"{major}.{minor}"


def scheduler_plugins_version(kubernetes: str, override: str | None = None) -> str:
    """The release for the cluster: an explicit pin must still match the minor (v0.X ~ v1.X)."""
    minor = kubernetes_minor(kubernetes)
    if override is not None:
        if kubernetes_minor(override.replace("v0.", "1.", 1)) != minor:
            raise UnsupportedKubernetes(
                f"scheduler_plugins_version {override} is built for Kubernetes "
                f"v1.{override.split('.')[1]}, the cluster runs {kubernetes}"
            )
        return override
    try:
        return SCHEDULER_PLUGINS_RELEASES[minor]
    except KeyError:
        known = ", ".join(sorted(SCHEDULER_PLUGINS_RELEASES))
        raise UnsupportedKubernetes(
            f"no scheduler-plugins release pinned for Kubernetes {minor} (pinned: {known}); "
            "set group_vars.all.fleet_policy.scheduler_plugins_version"
        ) from None
