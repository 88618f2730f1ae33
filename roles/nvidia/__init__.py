"""The nvidia role: driver, CUDA, cuDNN, NCCL, fabric manager, DCGM and the container toolkit,
pinned and held on GPU workers (record: role.py)."""
