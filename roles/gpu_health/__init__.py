"""GPU health: passive and active checks on a node, fleet sampling and budgeted cordoning.

This package is the role: its record, settings and rendered manifests. The checks themselves,
the gate and the fleet sampler are the agent, a program of its own in gpuhealth/, which reads
the settings and the constants below from here.

The preflight taint and the GPU worker label are the role toolkit's (toolkit/nodes.py), shared
with the kubernetes role: kubelet registers every GPU worker with both, and the gpu-health
DaemonSet lifts the taint only once the node's GPUs have passed their checks.
"""

from __future__ import annotations

from toolkit.nodes import (
    GPU_WORKER_LABEL_KEY,
    GPU_WORKER_LABEL_VALUE,
    PREFLIGHT_TAINT,
    PREFLIGHT_TAINT_EFFECT,
    PREFLIGHT_TAINT_KEY,
    PREFLIGHT_TAINT_VALUE,
)

# What the checks write on a node: `health fleet --cordon` annotates the nodes it cordons (for
# people); the in-cluster gate sets the condition (for controllers) and records Events.
HEALTH_ANNOTATION = "gpuinfra.io/gpu-health"
HEALTH_CONDITION = "GPUHealthy"

__all__ = [
    "GPU_WORKER_LABEL_KEY",
    "GPU_WORKER_LABEL_VALUE",
    "HEALTH_ANNOTATION",
    "HEALTH_CONDITION",
    "PREFLIGHT_TAINT",
    "PREFLIGHT_TAINT_EFFECT",
    "PREFLIGHT_TAINT_KEY",
    "PREFLIGHT_TAINT_VALUE",
]
