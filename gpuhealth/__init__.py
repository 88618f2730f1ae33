"""The GPU health agent: the program that checks a node's GPUs and acts on the verdict.

It runs on GPU nodes (`gpuinfra health run`, over ssh from `gpuinfra health fleet`) and in the
gpu-health pods (`python3 -m gpuhealth.gate`), from the gpuinfra wheel in the image. It is a
program of its own, not part of the gpu_health role: the role (roles/gpu_health/) is the record,
the settings, the rendered manifests and the ConfigMap's expectations; the agent reads those
settings and the shared constants from the role, and the role imports nothing from it.
"""
