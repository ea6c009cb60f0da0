"""Simulated machines: named presets and mig-parted-style topology files.

A topology says which GPUs a simulated machine has and how each one is cut
into MIG instances. ``load_topology`` takes one of these spellings:

- a preset name: ``dgx-h100`` (8x H100-80GB, MIG off), ``dgx-h100-mig``
  (8x H100-80GB, each 7x 1g.10gb), ``h200-mig-balanced`` (2x H200-141GB, each
  2x 1g.18gb + 1x 2g.35gb + 1x 3g.71gb), ``workstation-a100`` (2x A100-40GB:
  GPU 0 cut into 3g.20gb + 2g.10gb + 2x 1g.5gb, GPU 1 whole); and machines without
  MIG, the GPUs most labs have: ``l40s-4`` (4x L40S 48 GB), ``rtx-a6000-8`` (8x RTX
  A6000 48 GB), ``workstation-4090`` (2x GeForce RTX 4090 24 GB);
- the path of a YAML (``.yaml``/``.yml``) or JSON (``.json``) topology file;
- either of them followed by ``:N`` to scale the machine to N GPUs, e.g.
  ``dgx-h100-mig:64``: the GPU list repeats in order until it has N entries.
  Scaling keeps the UUID seed, so the first GPUs keep their UUIDs.

A topology file is a mig-parted config plus one ``simulate`` section naming
the GPUs and which of the file's mig-configs is applied to them::

    version: v1
    simulate:
      gpu-model: H100-80GB      # a catalog key, or a name NVML reports
      gpu-count: 8
      mig-config: balanced      # optional when there is only one
      gpu-name: NVIDIA H100 80GB HBM3   # optional: the name NVML reports
      privilege: monitor        # optional: root, monitor or none (see below)
      seed: lab-4               # optional: seeds the UUIDs (see below)
      processes: {2: [4242]}    # optional: real pids running on a GPU with MIG off
    mig-configs:
      balanced:
        - devices: [0, 1]       # or: all
          mig-enabled: true
          mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
        - devices: [2, 3, 4, 5, 6, 7]
          mig-enabled: false

Entries may carry mig-parted's ``device-filter`` (PCI device ids such as
``0x233010DE``); an entry whose filter leaves out the GPU model is skipped.
GPUs that no entry covers have MIG disabled. Instances are laid out largest
profile first, each at the lowest allowed start that still lets the rest fit.
Everything wrong with a spelling or a file raises :class:`TopologyError`
naming the problem.

``processes`` lists real OS processes as compute processes of whole GPUs, by GPU
index, for as long as they run (a machine on which someone already computes).

``privilege`` is what NVML lets the simulated caller do (see
:data:`.simulated.PRIVILEGES`); without it, ``$GPUBROKER_SIMULATE_PRIVILEGE``, else
root when the process runs as root and none otherwise. ``seed`` makes the UUIDs of a
simulated machine its own: two brokers simulating the same preset with different seeds
have different GPUs, so neither holds the other's machine-wide GPU locks; the broker
seeds it from its state file (see ``GPUBroker.simulate_seed``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from ..wire.profiles import CATALOG, MEMORY_SLICES, GpuModel, MigProfile, free_starts


class TopologyError(ValueError):
    """A topology spelling, preset name or file that cannot describe a machine."""


@dataclass(frozen=True)
class GpuSpec:
    """One simulated GPU: its catalog model and the MIG instances it starts with."""

    model: str
    mig_enabled: bool = False
    instances: tuple[tuple[str, int], ...] = ()
    """(profile name, placement start) of each GPU instance, in creation order."""
    name: str = ""
    """The name NVML reports, when not the catalog model's first (a GPU the catalog
    does not know by name: its profiles must then be read from NVML)."""
    pci_device_id: int = 0
    """The PCI device id, when not the catalog model's."""


@dataclass(frozen=True)
class Topology:
    """A simulated machine."""

    name: str
    gpus: tuple[GpuSpec, ...]
    seed: str = ""
    """Seeds the simulated UUIDs; empty means the name."""
    privilege: str | None = None
    """The simulated caller's privilege; None: as :func:`.simulated._privilege` says."""
    processes: tuple[tuple[int, int], ...] = ()
    """(GPU index, pid) of real OS processes listed on whole GPUs while they run."""

    def __post_init__(self) -> None:
        if not self.seed:
            object.__setattr__(self, "seed", self.name)

    def describe(self) -> str:
        """The machine in words: "8 H100-80GB GPUs, each cut into 7 1g.10gb slices",
        "an A100-40GB cut into 3g.20gb, 2g.10gb and 2 1g.5gb slices, and an A100-40GB
        with MIG off"."""
        runs: list[tuple[GpuSpec, int]] = []
        for gpu in self.gpus:
            if runs and runs[-1][0] == gpu:
                runs[-1] = (gpu, runs[-1][1] + 1)
            else:
                runs.append((gpu, 1))
        said = []
        for gpu, n in runs:
            what = f"{n} {gpu.model} GPUs" if n > 1 else f"one {gpu.model}"
            cut = Counter(profile for profile, _ in gpu.instances)
            if not gpu.mig_enabled:
                said.append(f"{what} with MIG off")
                continue
            parts = [f"{k} {p}" if k > 1 else p for p, k in cut.items()]
            slices = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
            said.append(f"{what}, {'each ' if n > 1 else ''}cut into {slices} slices")
        return "; ".join(said)

    def scaled(self, count: int) -> Topology:
        """The same machine with ``count`` GPUs, repeating its GPU list in order."""
        if count < 1:
            raise TopologyError(f"a topology needs at least one GPU, not {count}")
        gpus = tuple(self.gpus[i % len(self.gpus)] for i in range(count))
        processes = tuple(p for p in self.processes if p[0] < count)
        return replace(self, name=f"{self.name}:{count}", gpus=gpus, processes=processes)


def gpu_spec(model: str, mig_devices: Mapping[str, int] | None = None) -> GpuSpec:
    """A GPU of catalog ``model``; ``mig_devices`` (profile -> count) enables MIG and
    lays those instances out, ``None`` leaves MIG off."""
    found = CATALOG.get(model)
    if found is None:
        raise TopologyError(f"unknown GPU model {model!r}; known: {', '.join(CATALOG)}")
    if mig_devices is None:
        return GpuSpec(model)
    return GpuSpec(model, True, layout(found, mig_devices))


def layout(model: GpuModel, mig_devices: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Valid placements for ``mig_devices`` on one ``model`` GPU, largest profile first."""
    wanted: list[MigProfile] = []
    for name, count in mig_devices.items():
        profile = model.profile(name)
        if profile is None:
            raise TopologyError(
                f"MIG profile {name!r} does not exist on {model.key} GPUs; they have "
                + ", ".join(p.name for p in model.profiles)
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise TopologyError(f"the count of {name} must be a whole number >= 0, not {count!r}")
        if count > profile.max_count:
            raise TopologyError(
                f"{model.key} GPUs hold at most {profile.max_count}x {name}, not {count}"
            )
        wanted += [profile] * count
    wanted.sort(key=lambda p: (-p.size, -p.compute_slices, p.name))
    starts = _place(wanted, frozenset(), 0)
    if starts is None:
        needed = sum(p.size for p in wanted)
        shown = " + ".join(f"{n}x {name}" for name, n in mig_devices.items() if n)
        raise TopologyError(
            f"{shown} do not fit on one {model.key}: they need {needed} of its "
            f"{MEMORY_SLICES} memory slices"
            + ("" if needed > MEMORY_SLICES else " and no placement of them avoids overlap")
        )
    return tuple((p.name, s) for p, s in zip(wanted, starts, strict=True))


def _place(wanted: list[MigProfile], occupied: frozenset[int], floor: int) -> list[int] | None:
    """Backtracking search; equal profiles take increasing starts so that permutations
    of identical instances are not searched again."""
    if not wanted:
        return []
    first, rest = wanted[0], wanted[1:]
    for start in free_starts(first, set(occupied)):
        if start < floor:
            continue
        next_floor = start + 1 if rest and rest[0] == first else 0
        tail = _place(rest, occupied | set(first.slots(start)), next_floor)
        if tail is not None:
            return [start, *tail]
    return None


def _uniform(
    count: int, model: str, mig_devices: Mapping[str, int] | None = None
) -> tuple[GpuSpec, ...]:
    return (gpu_spec(model, mig_devices),) * count


PRESETS: dict[str, Topology] = {
    t.name: t
    for t in (
        Topology("dgx-h100", _uniform(8, "H100-80GB")),
        Topology("dgx-h100-mig", _uniform(8, "H100-80GB", {"1g.10gb": 7})),
        Topology(
            "h200-mig-balanced",
            _uniform(2, "H200-141GB", {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
        ),
        Topology(
            "workstation-a100",
            (
                gpu_spec("A100-40GB", {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}),
                gpu_spec("A100-40GB"),
            ),
        ),
        Topology("l40s-4", _uniform(4, "L40S-48GB")),
        Topology("rtx-a6000-8", _uniform(8, "RTXA6000-48GB")),
        Topology("workstation-4090", _uniform(2, "RTX4090-24GB")),
    )
}
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)
_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def load_topology(spec: str) -> Topology:
    """The topology a spelling names: ``preset``, ``path.yaml`` or either with ``:N``."""
    base, colon, suffix = spec.rpartition(":")
    count = int(suffix) if colon and suffix.isdigit() else None
    name = base if count is not None else spec
    if name in PRESETS:
        topology = PRESETS[name]
    elif Path(name).suffix.lower() in _FILE_SUFFIXES or Path(name).is_file():
        topology = read_topology_file(Path(name))
    else:
        raise TopologyError(
            f"unknown simulated topology {name!r}: name a preset ({', '.join(PRESET_NAMES)}) "
            "or a .yaml/.json topology file, optionally followed by ':<number of GPUs>'"
        )
    return topology if count is None else topology.scaled(count)


def read_topology_file(path: Path) -> Topology:
    """Parse a topology file (format in the module docstring)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise TopologyError(f"cannot read topology file {path}: {e.strerror}") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        kind = "JSON" if path.suffix.lower() == ".json" else "YAML"
        raise TopologyError(f"{path} is not valid {kind}: {e}") from None
    doc = _mapping(data, str(path), {"version", "simulate", "mig-configs"})
    if doc.get("version") != "v1":
        raise TopologyError(f"{path}: 'version' must be v1, not {doc.get('version')!r}")
    if "simulate" not in doc:
        raise TopologyError(
            f"{path} has no 'simulate' section naming the GPUs, e.g. "
            "simulate: {gpu-model: H100-80GB, gpu-count: 8}"
        )
    sim = _mapping(
        doc["simulate"],
        f"{path}: simulate",
        {"gpu-model", "gpu-count", "mig-config", "gpu-name", "privilege", "seed", "processes"},
    )
    model = _model(sim.get("gpu-model"), f"{path}: simulate.gpu-model")
    count = sim.get("gpu-count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TopologyError(
            f"{path}: simulate.gpu-count must be a whole number >= 1, not {count!r}"
        )
    configs = _mapping(doc.get("mig-configs"), f"{path}: mig-configs", None)
    selected = _select(configs, sim.get("mig-config"), path)
    entries = configs[selected]
    where = f"{path}: mig-configs.{selected}"
    if not isinstance(entries, list):
        raise TopologyError(f"{where} must be a list of entries")
    specs: dict[int, GpuSpec] = {}
    for n, entry in enumerate(entries):
        _apply(entry, model, count, specs, f"{where}[{n}]")
    name = sim.get("gpu-name") or ""
    if not isinstance(name, str):
        raise TopologyError(f"{path}: simulate.gpu-name must be text, not {name!r}")
    gpus = tuple(replace(specs.get(i, GpuSpec(model.key)), name=name) for i in range(count))
    optional = {k: str(sim[k]) for k in ("privilege", "seed") if sim.get(k) is not None}
    processes = _processes(sim.get("processes"), gpus, f"{path}: simulate.processes")
    return Topology(f"{path.stem}/{selected}", gpus, processes=processes, **optional)


def _processes(value: Any, gpus: tuple[GpuSpec, ...], where: str) -> tuple[tuple[int, int], ...]:
    """``{gpu index: [pid, ...]}``, checked: whole GPUs of this machine, positive pids."""
    found: list[tuple[int, int]] = []
    if value is None:
        return ()
    for index, pids in _mapping(value, where, None).items():
        if not isinstance(index, int) or not 0 <= index < len(gpus) or gpus[index].mig_enabled:
            raise TopologyError(
                f"{where}: {index!r} is not the index of a GPU with MIG off on this machine"
            )
        if not isinstance(pids, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in pids
        ):
            raise TopologyError(f"{where}.{index}: a list of process ids, not {pids!r}")
        found += [(index, pid) for pid in pids]
    return tuple(found)


def _mapping(value: Any, where: str, allowed: set[str] | None) -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        raise TopologyError(f"{where} must be a non-empty mapping")
    unknown = sorted(set(value) - allowed) if allowed is not None else []
    if unknown:
        known = ", ".join(sorted(allowed or ()))
        raise TopologyError(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))}; known: {known}"
        )
    return value


def _model(name: Any, where: str) -> GpuModel:
    model = CATALOG.get(name) if isinstance(name, str) else None
    model = model or next((m for m in CATALOG.values() if name in m.nvml_names), None)
    if model is None:
        raise TopologyError(f"{where}: unknown GPU model {name!r}; known: {', '.join(CATALOG)}")
    return model


def _select(configs: dict[str, Any], chosen: Any, path: Path) -> str:
    if chosen is None:
        if len(configs) == 1:
            return next(iter(configs))
        raise TopologyError(
            f"{path} has {len(configs)} mig-configs ({', '.join(configs)}): "
            "name the one to apply with simulate.mig-config"
        )
    if chosen not in configs:
        raise TopologyError(
            f"{path}: simulate.mig-config {chosen!r} is not one of its mig-configs "
            f"({', '.join(configs)})"
        )
    return str(chosen)


def _apply(entry: Any, model: GpuModel, count: int, specs: dict[int, GpuSpec], where: str) -> None:
    """Lay out one mig-config entry onto the GPUs it names."""
    e = _mapping(entry, where, {"devices", "mig-enabled", "mig-devices", "device-filter"})
    if not _filter_matches(e.get("device-filter"), model, where):
        return
    devices = e.get("devices")
    if devices == "all":
        indexes = list(range(count))
    elif isinstance(devices, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in devices
    ):
        indexes = devices
    else:
        raise TopologyError(f"{where}: 'devices' must be 'all' or a list of GPU indexes")
    enabled = e.get("mig-enabled")
    if not isinstance(enabled, bool):
        raise TopologyError(f"{where}: 'mig-enabled' must be true or false")
    mig_devices = e.get("mig-devices") or {}
    if not isinstance(mig_devices, dict):
        raise TopologyError(f"{where}: 'mig-devices' must map profile names to counts")
    if mig_devices and not enabled:
        raise TopologyError(f"{where}: 'mig-devices' given while 'mig-enabled' is false")
    try:
        spec = gpu_spec(model.key, mig_devices if enabled else None)
    except TopologyError as err:
        raise TopologyError(f"{where}: {err}") from None
    for i in indexes:
        if not 0 <= i < count:
            raise TopologyError(f"{where}: GPU index {i} is out of range (the machine has {count})")
        if i in specs:
            raise TopologyError(f"{where}: GPU {i} is already configured by an earlier entry")
        specs[i] = spec


def _filter_matches(device_filter: Any, model: GpuModel, where: str) -> bool:
    if device_filter is None:
        return True
    ids = [device_filter] if isinstance(device_filter, str) else device_filter
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise TopologyError(f"{where}: 'device-filter' must be a PCI id or a list of them")
    return f"0x{model.pci_device_id:08X}" in (i.upper().replace("0X", "0x") for i in ids)
