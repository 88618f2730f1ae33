"""A thin adapter over NVML, one method per query, so recorded answers can stand in for a GPU."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol


class NvmlError(Exception):
    """NVML refused a query: the driver is missing, or the GPU is lost (fallen off the bus)."""


@dataclass(frozen=True)
class RowRemapping:
    correctable: int  # rows remapped for correctable errors
    uncorrectable: int  # rows remapped for uncorrectable errors
    pending: bool  # a remap waits for a GPU reset; the bad row is still in use until then
    failed: bool  # the GPU ran out of spare rows or could not remap: RMA


@dataclass(frozen=True)
class RetiredPages:
    double_bit: int  # pages retired for double-bit (uncorrectable) errors
    single_bit: int  # pages retired for repeated single-bit errors
    pending: bool  # retirement waits for a reboot or reset


@dataclass(frozen=True)
class PcieLink:
    gen: int
    max_gen: int
    width: int
    max_width: int


class GpuQueries(Protocol):
    """What the checks ask of NVML. A method returns None where the GPU does not support the query
    (row remapping before Ampere, page retirement from Ampere on) and raises NvmlError otherwise."""

    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def name(self, index: int) -> str: ...
    def uuid(self, index: int) -> str: ...
    def pci_bus_id(self, index: int) -> str: ...
    def persistence_mode(self, index: int) -> bool | None: ...
    def ecc_uncorrected(self, index: int, *, volatile: bool) -> int | None: ...
    def retired_pages(self, index: int) -> RetiredPages | None: ...
    def row_remapping(self, index: int) -> RowRemapping | None: ...
    def clocks_event_reasons(self, index: int) -> int | None: ...
    def temperature_c(self, index: int) -> int | None: ...
    def performance_state(self, index: int) -> int | None: ...
    def pcie_link(self, index: int) -> PcieLink | None: ...
    def nvlink_states(self, index: int) -> list[bool] | None: ...


class PynvmlGpus:
    """The real adapter: calls pynvml (nvidia-ml-py) on this node."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlError(f"cannot initialise NVML: {exc}") from None
        except OSError as exc:  # libnvidia-ml.so missing: no driver on this node
            raise NvmlError(f"cannot load NVML (is the NVIDIA driver installed?): {exc}") from None

    def close(self) -> None:
        self._nvml.nvmlShutdown()

    def _call(self, function: str, *args: Any) -> Any:
        """Call pynvml; NOT_SUPPORTED becomes None, every other refusal an NvmlError."""
        nvml = self._nvml
        try:
            return getattr(nvml, function)(*args)
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise NvmlError(f"{function}: {exc}") from None

    def _handle(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def _device(self, function: str, index: int, *args: Any) -> Any:
        return self._call(function, self._handle(index), *args)

    def driver_version(self) -> str:
        return str(self._call("nvmlSystemGetDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def name(self, index: int) -> str:
        return str(self._device("nvmlDeviceGetName", index))

    def uuid(self, index: int) -> str:
        return str(self._device("nvmlDeviceGetUUID", index))

    def pci_bus_id(self, index: int) -> str:
        info = self._device("nvmlDeviceGetPciInfo", index)
        bus_id = info.busId
        return bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)

    def persistence_mode(self, index: int) -> bool | None:
        mode = self._device("nvmlDeviceGetPersistenceMode", index)
        return None if mode is None else mode == self._nvml.NVML_FEATURE_ENABLED

    def ecc_uncorrected(self, index: int, *, volatile: bool) -> int | None:
        nvml = self._nvml
        counter = nvml.NVML_VOLATILE_ECC if volatile else nvml.NVML_AGGREGATE_ECC
        return self._device(
            "nvmlDeviceGetTotalEccErrors", index, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter
        )

    def retired_pages(self, index: int) -> RetiredPages | None:
        nvml = self._nvml
        double = self._device(
            "nvmlDeviceGetRetiredPages", index, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        if double is None:
            return None
        single = self._device(
            "nvmlDeviceGetRetiredPages",
            index,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        pending = self._device("nvmlDeviceGetRetiredPagesPendingStatus", index)
        return RetiredPages(
            double_bit=len(double),
            single_bit=len(single or []),
            pending=pending == nvml.NVML_FEATURE_ENABLED,
        )

    def row_remapping(self, index: int) -> RowRemapping | None:
        rows = self._device("nvmlDeviceGetRemappedRows", index)
        if rows is None:
            return None
        correctable, uncorrectable, pending, failed = rows
        return RowRemapping(correctable, uncorrectable, bool(pending), bool(failed))

    def clocks_event_reasons(self, index: int) -> int | None:
        return self._device("nvmlDeviceGetCurrentClocksEventReasons", index)

    def temperature_c(self, index: int) -> int | None:
        return self._device("nvmlDeviceGetTemperature", index, self._nvml.NVML_TEMPERATURE_GPU)

    def performance_state(self, index: int) -> int | None:
        return self._device("nvmlDeviceGetPerformanceState", index)

    def pcie_link(self, index: int) -> PcieLink | None:
        gen = self._device("nvmlDeviceGetCurrPcieLinkGeneration", index)
        if gen is None:
            return None
        return PcieLink(
            gen=gen,
            # The link's maximum: the lower of what the GPU and the slot can do.
            max_gen=self._device("nvmlDeviceGetMaxPcieLinkGeneration", index),
            width=self._device("nvmlDeviceGetCurrPcieLinkWidth", index),
            max_width=self._device("nvmlDeviceGetMaxPcieLinkWidth", index),
        )

    def nvlink_states(self, index: int) -> list[bool] | None:
        """State of each NVLink the GPU has; links it lacks answer NOT_SUPPORTED and are skipped."""
        nvml = self._nvml
        handle = self._handle(index)
        states: list[bool] = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError as exc:
                if exc.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise NvmlError(f"nvmlDeviceGetNvLinkState: {exc}") from None
            states.append(state == nvml.NVML_FEATURE_ENABLED)
        return states or None


# The per-device queries, in the order a recording stores them.
DEVICE_QUERIES = (
    "name",
    "uuid",
    "pci_bus_id",
    "persistence_mode",
    "ecc_uncorrected_volatile",
    "ecc_uncorrected_aggregate",
    "retired_pages",
    "row_remapping",
    "clocks_event_reasons",
    "temperature_c",
    "performance_state",
    "pcie_link",
    "nvlink_states",
)


class RecordedGpus:
    """Answers NVML queries from a recording (see `record`); a query recorded as
    {"error": "..."} raises NvmlError, as a GPU that fell off the bus does."""

    def __init__(self, recording: dict[str, Any]) -> None:
        self._recording = recording
        self._devices: list[dict[str, Any]] = recording.get("devices", [])

    @classmethod
    def load(cls, path: Path) -> RecordedGpus:
        return cls(json.loads(path.read_text()))

    def _answer(self, value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"error"}:
            raise NvmlError(value["error"])
        return value

    def _device(self, index: int, query: str) -> Any:
        device = self._devices[index]
        if "error" in device:  # the whole device answers nothing
            raise NvmlError(device["error"])
        return self._answer(device.get(query))

    def driver_version(self) -> str:
        return self._answer(self._recording["driver_version"])

    def device_count(self) -> int:
        return len(self._devices)

    def name(self, index: int) -> str:
        return self._device(index, "name")

    def uuid(self, index: int) -> str:
        return self._device(index, "uuid")

    def pci_bus_id(self, index: int) -> str:
        return self._device(index, "pci_bus_id")

    def persistence_mode(self, index: int) -> bool | None:
        return self._device(index, "persistence_mode")

    def ecc_uncorrected(self, index: int, *, volatile: bool) -> int | None:
        return self._device(
            index, "ecc_uncorrected_volatile" if volatile else "ecc_uncorrected_aggregate"
        )

    def retired_pages(self, index: int) -> RetiredPages | None:
        data = self._device(index, "retired_pages")
        return None if data is None else RetiredPages(**data)

    def row_remapping(self, index: int) -> RowRemapping | None:
        data = self._device(index, "row_remapping")
        return None if data is None else RowRemapping(**data)

    def clocks_event_reasons(self, index: int) -> int | None:
        return self._device(index, "clocks_event_reasons")

    def temperature_c(self, index: int) -> int | None:
        return self._device(index, "temperature_c")

    def performance_state(self, index: int) -> int | None:
        return self._device(index, "performance_state")

    def pcie_link(self, index: int) -> PcieLink | None:
        data = self._device(index, "pcie_link")
        return None if data is None else PcieLink(**data)

    def nvlink_states(self, index: int) -> list[bool] | None:
        return self._device(index, "nvlink_states")


def record(gpus: GpuQueries) -> dict[str, Any]:
    """Every answer the checks use, as JSON-ready data that RecordedGpus replays."""

    def answer(query, *args, **kwargs) -> Any:
        try:
            value = query(*args, **kwargs)
        except NvmlError as exc:
            return {"error": str(exc)}
        if isinstance(value, RowRemapping | RetiredPages | PcieLink):
            return asdict(value)
        return value

    devices = []
    for index in range(gpus.device_count()):
        device = {
            query: answer(getattr(gpus, query), index)
            for query in DEVICE_QUERIES
            if not query.startswith("ecc_")
        }
        device["ecc_uncorrected_volatile"] = answer(gpus.ecc_uncorrected, index, volatile=True)
        device["ecc_uncorrected_aggregate"] = answer(gpus.ecc_uncorrected, index, volatile=False)
        devices.append({query: device[query] for query in DEVICE_QUERIES})
    return {"driver_version": answer(gpus.driver_version), "devices": devices}
