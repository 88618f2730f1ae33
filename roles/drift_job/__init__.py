"""The fleet drift check as a Kubernetes Indexed Job: one pod per `gpuinfra drift --shard`."""
