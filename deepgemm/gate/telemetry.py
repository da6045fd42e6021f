"""What the GPU was doing around a benchmark: SM clock, temperature, power, throttle reasons.

Read through NVML (the ``pynvml`` module of nvidia-ml-py) when importable, else by running
``nvidia-smi --query-gpu=...`` (tens of milliseconds a call, so only a fallback), else recorded as
unavailable with the reason. A point looks like::

    {"sm_mhz": 1980, "mem_mhz": 3201, "temp_c": 41, "power_w": 312.4, "reasons": ["sw_power_cap"]}

``reasons`` decodes NVML's clock event (throttle) reason bits; "gpu_idle" is normal between
benchmarks, "sw_power_cap", "hw_slowdown" and the thermal ones mean the clock was held down.
"""

from __future__ import annotations

import subprocess
from typing import Any, Callable

# NVML's nvmlClocksEventReason* / nvmlClocksThrottleReason* bits (nvml.h).
REASON_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def decode_reasons(mask: int) -> list[str]:
    mask = int(mask)
    names = [name for bit, name in REASON_BITS.items() if mask & bit]
    unknown = mask & ~sum(REASON_BITS)
    if unknown:
        names.append(f"other_0x{unknown:x}")
    return names


def _nvml_bus_id(pci_bus_id: str) -> str:
    """NVML spells the PCI domain with 8 hex digits ('00000000:18:00.0'); CUDA with 4."""
    domain, sep, rest = pci_bus_id.partition(":")
    return f"{int(domain, 16):08x}:{rest}".upper() if sep and rest.count(":") == 1 else pci_bus_id


class NvmlSource:
    name = "nvml"

    def __init__(self, nvml, pci_bus_id: str | None):
        self.nvml = nvml
        nvml.nvmlInit()
        if pci_bus_id:
            self.handle = nvml.nvmlDeviceGetHandleByPciBusId(_nvml_bus_id(pci_bus_id).encode())
        elif nvml.nvmlDeviceGetCount() == 1:
            self.handle = nvml.nvmlDeviceGetHandleByIndex(0)
        else:
            raise RuntimeError("several GPUs and no PCI bus id to pick the benchmarked one")
        # nvidia-ml-py renamed the call when NVML renamed throttle reasons to clock event reasons.
        self._reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)

    def read(self) -> dict:
        nvml, h = self.nvml, self.handle
        point: dict[str, Any] = {
            "sm_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
            "mem_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
            "temp_c": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
            "reasons": decode_reasons(self._reasons(h)),
        }
        try:
            point["power_w"] = round(nvml.nvmlDeviceGetPowerUsage(h) / 1000.0, 1)  # mW
        except Exception:  # not supported on every board (NVML raises NotSupported)
            pass
        return point


SMI_FIELDS = ["clocks.sm", "clocks.mem", "temperature.gpu", "power.draw"]
# nvidia-smi renamed the field with NVML; drivers before the rename know only the old name.
SMI_REASON_FIELDS = ["clocks_event_reasons.active", "clocks_throttle_reasons.active"]


def _number(text: str):
    try:
        value = float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"
    return int(value) if value.is_integer() else value


class SmiSource:
    name = "nvidia-smi"

    def __init__(self, pci_bus_id: str | None, runner: Callable[..., str] | None = None):
        self.target = ["--id=" + pci_bus_id] if pci_bus_id else ["--id=0"]
        self._run = runner or self._subprocess
        self._reason_field = None
        for field in SMI_REASON_FIELDS:  # find the reason field this driver knows
            try:
                self._query(SMI_FIELDS + [field])
            except (OSError, subprocess.SubprocessError, ValueError):
                continue
            self._reason_field = field
            break
        if self._reason_field is None:
            raise RuntimeError("nvidia-smi did not answer a clock query")

    @staticmethod
    def _subprocess(args: list[str]) -> str:
        return subprocess.run(args, capture_output=True, text=True, timeout=10, check=True).stdout

    def _query(self, fields: list[str]) -> list[str]:
        out = self._run(["nvidia-smi", *self.target, "--query-gpu=" + ",".join(fields),
                         "--format=csv,noheader,nounits"])
        values = [v.strip() for v in out.strip().splitlines()[0].split(",")] if out.strip() else []
        if len(values) != len(fields):
            raise ValueError(f"nvidia-smi answered {out!r} to {fields}")
        return values

    def read(self) -> dict:
        values = self._query(SMI_FIELDS + [self._reason_field])
        sm, mem, temp, power, reasons = values
        point = {"sm_mhz": _number(sm), "mem_mhz": _number(mem), "temp_c": _number(temp),
                 "reasons": decode_reasons(int(reasons, 16)) if reasons.startswith("0x") else []}
        if _number(power) is not None:
            point["power_w"] = _number(power)
        return point


class Telemetry:
    """``read()`` -> a point, or {"unavailable": why}; ``source`` names where points come from."""

    def __init__(self, pci_bus_id: str | None = None, *, nvml_module=None, smi_runner=None,
                 use_nvml: bool = True, use_smi: bool = True):
        self.source = None
        self.unavailable: str | None = None
        reasons = []
        if use_nvml:
            try:
                nvml = nvml_module
                if nvml is None:
                    import pynvml as nvml  # nvidia-ml-py; optional
                self.source = NvmlSource(nvml, pci_bus_id)
            except Exception as exc:  # ImportError, NVMLError_*: fall back, keep the reason
                reasons.append(f"NVML: {exc.__class__.__name__}: {exc}")
        if self.source is None and use_smi:
            try:
                self.source = SmiSource(pci_bus_id, smi_runner)
            except Exception as exc:
                reasons.append(f"nvidia-smi: {exc.__class__.__name__}: {exc}")
        if self.source is None:
            self.unavailable = "; ".join(reasons) or "disabled"

    def read(self) -> dict:
        if self.source is None:
            return {"unavailable": self.unavailable}
        try:
            return self.source.read()
        except Exception as exc:  # a query failing mid-run must not fail the benchmark
            return {"unavailable": f"{self.source.name}: {exc.__class__.__name__}: {exc}"}

    def around(self, before: dict, after: dict) -> dict:
        """The record stored in a benchmark's extra_info['telemetry']."""
        record = {"source": self.source.name if self.source else None, "before": before, "after": after}
        if self.source is None:
            record = {"source": None, "unavailable": self.unavailable}
        return record
