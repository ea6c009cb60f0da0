"""The broker's own settings (``c.GPUBroker.*``): its state file, hardware, queue and users.

A mixin of :class:`~.gpubroker.GPUBroker` (a ``HasTraits``, not a ``Configurable``, so
the only config section is ``GPUBroker``); the settings of monitoring and reclaim are in
:mod:`.monitoring` and :mod:`.reclaim`. Each value is checked when it is set, with one
sentence that names it.
"""

from __future__ import annotations

import getpass
import os
from typing import Any

from traitlets import (
    Bool,
    Dict,
    Enum,
    HasTraits,
    List,
    TraitError,
    Unicode,
    default,
    validate,
)
from traitlets import Set as SetTrait

from ..broker.models import check_name
from ..broker.policy import POLICIES, Policy, Window, configured_policy
from ..nvml import SIMULATE_ENV, seed_for
from ..paths import (
    LOCK_DIR_ENV,
    STATE_FILE_ENV,
    USER_LOCK_DIR_ENV,
    default_lock_dir,
    default_state_path,
    default_user_lock_dir,
)
from ..wire.errors import InvalidRequest
from ..wire.sizes import MAX_DURATION_S, RESOLUTION
from ..wire.traits import Seconds
from .inventory import InventoryClass, source_class, source_names


class BrokerSettings(HasTraits):
    """What the broker runs on and for whom."""

    state_file = Unicode(
        help=f"SQLite file holding requests, leases, usage and quotas "
        f"(default ${STATE_FILE_ENV}, else <jupyter data dir>/gpubroker/state.sqlite).",
    ).tag(config=True)

    @default("state_file")
    def _default_state_file(self) -> str:
        return os.environ.get(STATE_FILE_ENV) or str(default_state_path())

    simulate = Unicode(
        help=f"Run on a simulated GPU machine: a preset (dgx-h100, dgx-h100-mig, "
        f"h200-mig-balanced, workstation-a100, optionally ':N' GPUs) or a topology file. "
        f"Empty: the real NVIDIA driver. Default ${SIMULATE_ENV}.",
    ).tag(config=True)

    @default("simulate")
    def _default_simulate(self) -> str:
        return os.environ.get(SIMULATE_ENV, "")

    simulate_seed = Unicode(
        help="Seeds the UUIDs of the simulated GPUs: brokers with different seeds simulate "
        "different machines, whose GPUs never meet in the machine-wide GPU locks. Default: "
        "the state file's path, so a broker keeps its simulated GPUs across restarts and "
        "never blocks another one's.",
    ).tag(config=True)

    @default("simulate_seed")
    def _default_simulate_seed(self) -> str:
        return seed_for(self.state_file)

    gpu_lock_dir = Unicode(
        help=f"Where a broker running as root keeps one lock file per GPU UUID, so that no "
        f"other broker on the machine (whatever its user or state file) manages its GPUs. "
        f"Only root may write it: created 0755, refused if another user owns it or may write "
        f"in it (default ${LOCK_DIR_ENV}, else {default_lock_dir()}).",
    ).tag(config=True)

    @default("gpu_lock_dir")
    def _default_gpu_lock_dir(self) -> str:
        return os.environ.get(LOCK_DIR_ENV) or str(default_lock_dir())

    user_gpu_lock_dir = Unicode(
        help=f"Where brokers of ordinary users (not root) keep their per-GPU lock files, "
        f"shared by every user: world-writable and sticky, created so when missing. Such a "
        f"broker also refuses GPUs root's broker holds in gpu_lock_dir (default "
        f"${USER_LOCK_DIR_ENV}, else {default_user_lock_dir()}).",
    ).tag(config=True)

    @default("user_gpu_lock_dir")
    def _default_user_gpu_lock_dir(self) -> str:
        return os.environ.get(USER_LOCK_DIR_ENV) or str(default_user_lock_dir())

    policy = Enum(
        sorted(POLICIES), default_value="broker", help="Ordering policy: broker, slurm or fcfs."
    ).tag(config=True)
    policy_params = Dict(
        help="Parameters of the policy, e.g. {'half_life_s': 86400, 'max_wait_s': 7200}; "
        "see jupyter_gpubroker.broker.policy for each policy's fields.",
    ).tag(config=True)
    windows = List(
        Dict(),
        help="Time-of-day windows of the broker policy, checked in order: "
        "[{'name': 'day', 'start': '08:00', 'end': '19:00', 'days': 'mon-fri', "
        "'weights': {'interactive': 2000, 'batch': 0}}, ...]. Empty: the built-in ones.",
    ).tag(config=True)
    timezone = Unicode("UTC", help="Time zone the windows are read in (IANA name).").tag(
        config=True
    )
    lease_ttl = Seconds(
        120.0,
        1.0,
        MAX_DURATION_S,
        help="Seconds a lease lives without a heartbeat from its holder before it expires.",
    ).tag(config=True)
    request_ttl = Seconds(
        None,
        1.0,
        MAX_DURATION_S,
        allow_none=True,
        help="Seconds a request waiting in the queue lives without a heartbeat from its holder "
        "(the client waiting for it) before it expires; None: lease_ttl.",
    ).tag(config=True)
    vacate_timeout = Seconds(
        60.0,
        0.0,
        MAX_DURATION_S,
        help="Seconds the devices of an ended lease wait for its processes to exit (as NVML "
        "lists them) before they are drained with the lingering pid as the reason; until "
        "then nobody is granted them.",
    ).tag(config=True)
    tick_interval = Seconds(
        2.0,
        RESOLUTION,
        3600.0,
        help="Seconds between the broker's housekeeping passes (expiry, scheduling).",
    ).tag(config=True)
    inventory_class = InventoryClass(
        help="Where the inventory comes from, as a class (a dotted name in config files): "
        "jupyter_gpubroker.runtime.NvmlInventory (this machine's GPUs, real or simulated; "
        "the default), or an engine's reader, re-read every tick: "
        "jupyter_gpubroker.engines.slurm.SlurmInventory (c.SlurmInventory.*), "
        "jupyter_gpubroker.engines.kubernetes.KubernetesInventory (c.KubernetesInventory.*), "
        "or any subclass of jupyter_gpubroker.engines.InventorySource. When unset, "
        "inventory_source names it.",
    ).tag(config=True)

    @default("inventory_class")
    def _default_inventory_class(self) -> type:
        return source_class(self.inventory_source)

    inventory_source = Unicode(
        "nvml",
        help="inventory_class by name, a shorthand: 'nvml' (this machine's GPUs), or an "
        "engine of the jupyter_gpubroker.engines entry point group: 'slurm', 'kubernetes' or "
        "a plugin's. inventory_class wins when both are set.",
    ).tag(config=True)

    @validate("inventory_source")
    def _check_inventory_source(self, proposal: dict[str, Any]) -> str:
        name = proposal["value"]
        if name not in source_names():
            raise TraitError(
                f"c.GPUBroker.inventory_source is one of {', '.join(source_names())}, not {name!r}"
            )
        return str(name)

    engine_grace = Seconds(
        60.0,
        0.0,
        MAX_DURATION_S,
        help="With an engine: seconds after a grant in which its job (Slurm) may still be "
        "missing from the engine's queue; a lease whose job is missing after that (ended, "
        "cancelled outside the hub, or gone while the broker was down) is released.",
    ).tag(config=True)
    dynamic_mig = Bool(
        False, help="Re-cut idle MIG GPUs to fit waiting profiles (needs root on real GPUs)."
    ).tag(config=True)
    quotas_file = Unicode(
        "",
        help="YAML or JSON file of shares and quotas applied at start: "
        "{users: {alice: {share: 2, max_gpus: 1}}, groups: {lab: {gpu_hours: 100, "
        "period_s: 604800}}}. Entities it names are reset to it on every start.",
    ).tag(config=True)
    identity = Enum(
        ["owner", "username"],
        default_value="owner",
        help="Whose requests an API call makes. 'owner': every authenticated caller is the "
        "server's owner (a single-user Jupyter server, where the token already grants "
        "everything), and the owner is the admin of this embedded broker. 'username': the "
        "identity provider's username (multi-user setups); only admin_users are admins.",
    ).tag(config=True)
    owner = Unicode(
        help="The server owner's user name (default $JUPYTERHUB_USER, else the OS user): "
        "with identity='owner' every caller and this broker's admin; the user a kernel is "
        "charged to when no request started it."
    ).tag(config=True)

    @default("owner")
    def _default_owner(self) -> str:
        return os.environ.get("JUPYTERHUB_USER") or getpass.getuser()

    admin_users = SetTrait(
        Unicode(),
        help="Users allowed to see every lease and change quotas. With identity='owner' the "
        "server's owner is one too (the single user of that server); with "
        "identity='username' only the users named here are.",
    ).tag(config=True)
    holder_account = Enum(
        ["broker", "user"],
        default_value="broker",
        help="Which local account runs each user's kernels and single-user servers on this "
        "machine, so whose process a lease's renewal may name as its holder (holder_pid), "
        "and whose processes a suspend may touch. 'broker': this broker's own account, for "
        "every user (the default of a Jupyter server's own broker, whose kernels all run as "
        "the server's account; a demo hub whose spawner starts every server as the hub's "
        "user). 'user': the user's own account, of the same name (the default of the hub "
        "service, whose spawner starts servers as their users; a user with no account "
        "here can name no process).",
    ).tag(config=True)
    kernel_token_max_age = Seconds(
        6 * 3600.0,
        1.0,
        MAX_DURATION_S,
        help="Seconds a kernel token lives after its kernel's server last said the kernel "
        "runs (the embedded broker's tick, for the kernels its server runs; a server using "
        "a central broker renews its kernels' leases, and their tokens every third of "
        "this): the token of a kernel that is gone (its server killed, say) stops working "
        "at most this long after. Its own use renews nothing.",
    ).tag(config=True)
    user_groups = Dict(
        key_trait=Unicode(),
        value_trait=List(Unicode()),
        help="Groups each user belongs to, e.g. {'alice': ['lab-a']}: a request is charged to "
        "the first group it names, which must be one of its user's (default: the first listed).",
    ).tag(config=True)

    @validate("admin_users", "user_groups")
    def _check_names(self, proposal: dict[str, Any]) -> Any:
        """Configured names follow the API's one rule (``check_name``) from the start, not
        a refusal of every call of the user they name later."""
        name, value = proposal["trait"].name, proposal["value"]
        groups = value.values() if isinstance(value, dict) else []
        try:
            for user in value:
                check_name(user, "user")
            for group in (g for named in groups for g in named):
                check_name(group, "group")
        except InvalidRequest as e:
            raise TraitError(f"GPUBroker.{name}: {e.message}") from None
        return value

    @validate("windows")
    def _check_windows(self, proposal: dict[str, Any]) -> list[dict[str, Any]]:
        for w in proposal["value"]:
            try:
                Window.from_dict(w)
            except InvalidRequest as e:
                raise TraitError(f"GPUBroker.windows: {e.message}") from None
        return list(proposal["value"])

    @property
    def on_this_machine(self) -> bool:
        """The inventory is this machine's NVML (no engine)."""
        local: bool = self.inventory_class.local
        return local

    def make_policy(self) -> Policy:
        """The ordering policy with its parameters, time zone and windows."""
        return configured_policy(self.policy, self.policy_params, self.windows, self.timezone)

    def recorded_settings(self) -> dict[str, Any]:
        """What a replay of the state file needs of these settings (``replay.whatif``)."""
        return {
            "policy": self.policy,
            "policy_params": dict(self.policy_params),
            "windows": list(self.windows),
            "timezone": self.timezone,
            "dynamic_mig": self.dynamic_mig,
        }
