"""The GPU checks that need a real GPU, in one run (for a session that is lent a GPU machine).

    python3 scripts/gpu_device_check.py OUTDIR [MODEL]

MODEL is the family token `health run --expect-model` is held to (default H200, the first lent
machine; H100 for an nvidia-h100-x1 lease).

Runs from the repository root with the machine's own python3: PyTorch, CuPy, nvidia-ml-py,
typer and rich from the machine's image, and pydantic (the health settings' model), which the
lent machine's image lacks, installed first from wheels carried beside the tree. Nothing here
needs pyinfra. Writes into OUTDIR:
- `smi.txt`: nvidia-smi's summary and `nvidia-smi -q` (clocks, ECC, remapping, PCIe);
- `stack-probe.txt`: what the nvidia role's fact script (roles/nvidia/stack_probe.py) prints;
- `record.json`: `gpuinfra health record` of this node, with the active measurements added in
  the shape `health run --replay` reads (a test fixture captured from hardware);
- `run.json`: `gpuinfra health run --format json` on the live GPUs (PyTorch backend);
- `smi-samples.csv`: SM clock, power and throttle reasons every 200 ms during that run;
- `run-contended.json`: the same run while another process keeps the GPU busy (the negative
  case: the burn-in must fall below its line);
- `summary.json`: the exit codes, the CuPy backend's figures beside PyTorch's, timings,
  whether replaying the recording gives the live verdict, and the contended run's verdict.
Each step is timed and a failing step is recorded, never fatal to the others.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GPUINFRA = [
    sys.executable,
    "-c",
    "import sys; from cli.launch import main; sys.argv[0] = 'gpuinfra'; main()",
]
# The lent machine has one GPU of the model given on the command line: hold it to that.
MODEL = sys.argv[2] if len(sys.argv) > 2 else "H200"
HEALTH_RUN = [*GPUINFRA, "health", "run", "--format", "json", "--expect-count", "1"]
HEALTH_RUN += ["--expect-model", MODEL]


def step(summary: dict, name: str, work) -> object:
    started = time.perf_counter()
    try:
        value = work()
        summary["steps"][name] = {"ok": True, "seconds": round(time.perf_counter() - started, 2)}
        return value
    except Exception:
        summary["steps"][name] = {
            "ok": False,
            "seconds": round(time.perf_counter() - started, 2),
            "error": traceback.format_exc()[-2000:],
        }
        return None


def shell(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def smi(out: Path) -> None:
    parts = []
    for argv in (["nvidia-smi"], ["nvidia-smi", "-q"], ["nvidia-smi", "topo", "-m"]):
        done = shell(argv, timeout=120)
        parts.append(f"$ {' '.join(argv)}  (exit {done.returncode})\n{done.stdout}{done.stderr}")
    (out / "smi.txt").write_text("\n".join(parts))


def stack_probe(out: Path, summary: dict) -> None:
    plain = shell([sys.executable, "roles/nvidia/stack_probe.py"])
    text = f"# plain\n{plain.stdout}{plain.stderr}"
    # The image's NCCL and cuDNN come as pip wheels, outside the library directories the probe
    # knows: ask again with them on the loader's path, to see the libraries answer.
    import site

    extra = [
        str(path) for base in site.getsitepackages() for path in Path(base).glob("nvidia/*/lib")
    ]
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(extra))
    wheels = subprocess.run(
        [sys.executable, "roles/nvidia/stack_probe.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    text += f"\n# with the pip wheels' libraries on LD_LIBRARY_PATH\n{wheels.stdout}{wheels.stderr}"
    (out / "stack-probe.txt").write_text(text)
    summary["stack_probe_exit"] = [plain.returncode, wheels.returncode]


# Clocks, power and throttle reasons, sampled every 200 ms while the live run works: they say
# whether the sustained burn-in figure is the power cap lowering clocks.
SAMPLER = [
    "nvidia-smi",
    "--format=csv",
    "-lms",
    "200",
    "--query-gpu=timestamp,clocks.sm,"
    "clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active",
]


def health_run(out: Path, summary: dict) -> dict:
    with open(out / "smi-samples.csv", "w") as samples:
        sampler = subprocess.Popen(SAMPLER, stdout=samples, stderr=subprocess.STDOUT)
        try:
            done = shell(HEALTH_RUN, timeout=400)
        finally:
            sampler.terminate()
            sampler.wait()
    (out / "run.json").write_text(done.stdout)
    summary["run_exit"] = done.returncode
    summary["run_stderr"] = done.stderr[-2000:]
    return json.loads(done.stdout)


def health_record(out: Path, summary: dict, live: dict | None) -> Path:
    path = out / "record.json"
    done = shell(GPUINFRA + ["health", "record", str(path)], timeout=120)
    summary["record_exit"] = done.returncode
    summary["record_output"] = (done.stdout + done.stderr)[-2000:]
    recording = json.loads(path.read_text())
    if live is not None:
        by_check: dict[str, list] = {}
        for check in live["checks"]:
            if check["check"] in ("matmul", "membw", "allreduce"):
                by_check.setdefault(check["check"], []).append(check["value"])
        recording["active"] = {
            "backend": live["backend"],
            "matmul_tflops": by_check.get("matmul", []),
            "memory_bandwidth_gbps": by_check.get("membw", []),
            "allreduce_busbw_gbps": None,  # one GPU: nothing to all-reduce with
        }
    recording["description"] = f"1x {MODEL} on a lent machine: live NVML answers and measurements"
    path.write_text(json.dumps(recording, indent=2) + "\n")
    return path


def replay(path: Path, summary: dict, live: dict | None) -> None:
    done = shell([*HEALTH_RUN, "--replay", str(path)], timeout=120)
    replayed = json.loads(done.stdout)
    summary["replay_exit"] = done.returncode
    summary["replay_verdict"] = replayed["verdict"]
    summary["live_verdict"] = live["verdict"] if live else None


def cupy_figures(summary: dict) -> None:
    import cupy

    from gpuhealth.active import CupyBackend

    backend = CupyBackend(cupy)
    summary["cupy"] = {
        "version": cupy.__version__,
        "matmul_fp16_tflops": round(backend.matmul_tflops(0, 8192, 50), 1),
        "memory_bandwidth_gbps": round(backend.memory_bandwidth_gbps(0, 4096), 1),
    }


# Another job on the same GPU: bf16 products back to back until killed.
BURNER = """
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("burning", flush=True)
while True:
    for _ in range(50):
        a @ b
    torch.cuda.synchronize()
"""


def contended(out: Path, summary: dict) -> None:
    """The negative case on hardware: with another process busy on the GPU, the burn-in must
    measure far less and the node must not read as healthy. The uncontended run above is the
    positive control."""
    burner = subprocess.Popen(
        [sys.executable, "-c", BURNER], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert burner.stdout is not None and burner.stdout.readline().strip() == "burning"
        done = shell(HEALTH_RUN, timeout=400)
    finally:
        burner.kill()
        burner.wait()
    (out / "run-contended.json").write_text(done.stdout)
    report = json.loads(done.stdout)
    summary["contended"] = {
        "exit": done.returncode,
        "verdict": report["verdict"],
        "checks": {
            check["check"]: [check["measured"], check["verdict"]]
            for check in report["checks"]
            if check["check"] in ("matmul", "membw", "throttle")
        },
    }


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"steps": {}, "python": sys.version}
    step(summary, "smi", lambda: smi(out))
    step(summary, "stack_probe", lambda: stack_probe(out, summary))
    live = step(summary, "health_run", lambda: health_run(out, summary))
    path = step(summary, "health_record", lambda: health_record(out, summary, live))
    if path is not None:
        step(summary, "replay", lambda: replay(path, summary, live))
    step(summary, "cupy", lambda: cupy_figures(summary))
    step(summary, "contended", lambda: contended(out, summary))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
