"""``capacity="auto"``: the state shared across requests, in memory and cached on disk.

The cost curve is measured once per model, device, dtype and thread count and cached on disk
with its online corrections; the calibration is kept per model, method and decoding mode and
warm-starts each request.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from racer_rs._io import write_text_atomically
from racer_rs.autosize.calibration import EdgeCalibration
from racer_rs.autosize.cost_model import CostModel, measure_cost_model
from racer_rs.target.packed_linear import packed_layers

#: Cached-state format; files of another format are measured again.
STATE_FORMAT = 1

_costs: dict[str, CostModel] = {}
_calibrations: dict[str, dict[str, Any]] = {}


def model_key(model: Any) -> str:
    """A short identity of a model's weights and configuration (not its file's path)."""
    config = model.config.to_dict()
    config.pop("_name_or_path", None)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    parameters = list(model.parameters())
    digest.update(str(sum(p.numel() for p in parameters)).encode())
    for parameter in (parameters[0], parameters[-1]):
        digest.update(parameter.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def state_dir(kind: str) -> Path:
    from racer_rs.loading.gguf_cache import cache_root

    return cache_root() / "tree_size" / kind


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent, unreadable or half-written: measured again, never trusted
    return data if isinstance(data, dict) and data.get("format") == STATE_FORMAT else None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (temporary file, then rename); a failure only loses the cache."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps({"format": STATE_FORMAT, **data}))
    except OSError:
        pass


def cost_key(model: Any) -> str:
    """Key of a cost curve: model, device (its kind and the hardware), dtype, torch's thread count
    and whether its linear weights are packed (:mod:`racer_rs.target.packed_linear`: another
    curve)."""
    import torch

    parameter = next(model.parameters())
    device = parameter.device
    dtype = str(parameter.dtype).removeprefix("torch.")
    packed = "-packed" if packed_layers(model) else ""
    return f"{model_key(model)}-{device.type}-{_hardware_id(device)}-{dtype}-{torch.get_num_threads()}t{packed}"


def _hardware_id(device: Any) -> str:
    """A short digest of the processor a curve is measured on: a cache folder may be shared by
    machines (a network home), and a curve's shape is the hardware's."""
    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{platform.machine()}-{platform.processor()}-{_cpu_model()}-{os.cpu_count()}"
    return hashlib.sha256(name.encode()).hexdigest()[:8]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    except OSError:
        return ""


def cost_model(model: Any, max_capacity: int) -> CostModel:
    """The model's cost model: from this process, else the disk cache, else measured now."""
    key = cost_key(model)
    cached = _costs.get(key)
    if cached is None:
        state = read_json(state_dir("cost") / f"{key}.json")
        try:
            cached = CostModel.from_state(state["cost"]) if state else None
        except (KeyError, ValueError):
            cached = None
    if cached is None or cached.max_size < max_capacity:
        cached = measure_cost_model(model, max_capacity)
    _costs[key] = cached
    return cached


def save_cost_model(model: Any, cost: CostModel) -> None:
    """Store the (corrected) cost model on disk."""
    write_json(state_dir("cost") / f"{cost_key(model)}.json", {"cost": cost.state()})


def calibration_key(model: Any, method: str, greedy: bool) -> str:
    """Key of a calibration: model, method and decoding mode."""
    return f"{model_key(model)}-{method}-{'greedy' if greedy else 'sampling'}"


def load_calibration(key: str) -> EdgeCalibration:
    """A calibration warm-started from this process's or the disk's last state for ``key``."""
    calibration = EdgeCalibration()
    state = _calibrations.get(key)
    if state is None:
        stored = read_json(state_dir("calibration") / f"{key}.json")
        state = stored.get("calibration") if stored else None
    if state is not None:
        with contextlib.suppress(ValueError, KeyError, TypeError):  # a damaged state: the priors
            calibration.load(state)
    return calibration


def save_calibration(key: str, calibration: EdgeCalibration) -> None:
    """Keep a request's final calibration for the next request (in memory and on disk)."""
    _calibrations[key] = calibration.state()
    write_json(state_dir("calibration") / f"{key}.json", {"calibration": _calibrations[key]})
