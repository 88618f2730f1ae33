"""Runs ON a GPU worker (sent by facts.NvidiaStack to the host's python3, standard library
only): prints key=value lines describing the NVIDIA stack. Each library is asked for its own
version through ctypes: libcuda and libnccl answer without a GPU or a loaded kernel module;
NVML (through nvidia-smi) needs both."""

import ctypes
import glob
import os
import subprocess

LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",  # Debian's NVIDIA libraries
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/local/cuda/lib64",
)


def out(key, value):
    print(f"{key}={value}")


def library(*names):
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    return None


def so_names(pattern):
    found = {os.path.basename(p) for d in LIBRARY_DIRS for p in glob.glob(f"{d}/{pattern}")}
    return ",".join(sorted(found))


def dotted(code, new_from):
    """NCCL >= 2.9 and cuDNN >= 9 encode major*10000+minor*100+patch; older ones *1000."""
    if code >= new_from:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def nvml():
    query = ["nvidia-smi", "--query-gpu=driver_version,persistence_mode", "--format=csv,noheader"]
    try:
        smi = subprocess.run(query, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        out("nvml_error", "nvidia-smi not installed")
        return
    lines = smi.stdout.strip().splitlines()
    if smi.returncode != 0 or not lines:
        said = (smi.stdout + smi.stderr).strip().splitlines()
        out("nvml_error", said[0][:200] if said else f"nvidia-smi exit {smi.returncode}")
        return
    rows = [line.split(", ") for line in lines]
    out("driver_version", ",".join(sorted({row[0] for row in rows})))
    out("persistence", ",".join(sorted({row[1] for row in rows if len(row) > 1})))
    out("gpus", len(rows))


def main():
    out("driver_loaded", "yes" if os.path.exists("/proc/driver/nvidia/version") else "no")
    nvml()
    out("nvml_library", so_names("libnvidia-ml.so.*.*"))
    cuda = library("libcuda.so.1")
    if cuda is not None:
        version = ctypes.c_int()
        if cuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
            out("cuda_driver_api", f"{version.value // 1000}.{version.value % 1000 // 10}")
    nccl = library("libnccl.so.2")
    if nccl is not None:
        version = ctypes.c_int()
        if nccl.ncclGetVersion(ctypes.byref(version)) == 0:
            out("nccl", dotted(version.value, 20900))
    out("nccl_library", so_names("libnccl.so.*.*"))
    cudnn = library("libcudnn.so.9", "libcudnn.so.8")
    if cudnn is not None:
        cudnn.cudnnGetVersion.restype = ctypes.c_size_t
        out("cudnn", dotted(cudnn.cudnnGetVersion(), 90000))
    out("cudnn_library", so_names("libcudnn.so.*.*"))
    devices = "/proc/driver/nvidia-nvswitch/devices"
    out("nvswitch_devices", len(os.listdir(devices)) if os.path.isdir(devices) else 0)
    try:
        state = subprocess.run(
            ["systemctl", "is-active", "nvidia-fabricmanager"], capture_output=True, text=True
        )
    except FileNotFoundError:  # no systemd here (a container, the lent GPU machine's VM)
        out("fabricmanager", "unknown")
        return
    out("fabricmanager", state.stdout.strip() or "unknown")


if __name__ == "__main__":
    main()
