"""GPU health: passive and active checks on a node, fleet sampling and budgeted cordoning.

The constants here are shared with the kubernetes role: kubelet registers every GPU worker with
the preflight taint and the GPU worker label, and the gpu-health DaemonSet lifts the taint only
once the node's GPUs have passed their checks.
"""

from __future__ import annotations

# A new GPU node must not take work until its GPUs proved themselves (reference design: nodes
# join with a preflight taint that the GPU test DaemonSet removes). Kubelet flag form:
# `--register-with-taints=gpuinfra.io/preflight=true:NoSchedule`.
PREFLIGHT_TAINT_KEY = "gpuinfra.io/preflight"
PREFLIGHT_TAINT_VALUE = "true"
PREFLIGHT_TAINT_EFFECT = "NoSchedule"
PREFLIGHT_TAINT = f"{PREFLIGHT_TAINT_KEY}={PREFLIGHT_TAINT_VALUE}:{PREFLIGHT_TAINT_EFFECT}"

# The label kubelet sets on GPU workers (`--node-labels`) so the health DaemonSet lands on them
# only; gpuinfra.io is outside the kubernetes.io prefixes that NodeRestriction reserves.
GPU_WORKER_LABEL_KEY = "gpuinfra.io/gpu-worker"
GPU_WORKER_LABEL_VALUE = "true"

# What the checks write on a node: `health fleet --cordon` annotates the nodes it cordons (for
# people); the in-cluster gate sets the condition (for controllers) and records Events.
HEALTH_ANNOTATION = "gpuinfra.io/gpu-health"
HEALTH_CONDITION = "GPUHealthy"
