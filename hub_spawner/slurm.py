"""GPU servers on a Slurm cluster: the GPU spawner over batchspawner's ``SlurmSpawner``.

The broker service reads the cluster (``c.GPUBroker.inventory_source = "slurm"``) and
orders the hub's GPU requests. ``GPUBrokerSlurmSpawner`` (``"gpubroker-slurm"``) waits
for the grant as ``GPUBrokerSpawner`` does, the spawn page showing the queue's position
and ETA; then it submits the server's job with the granted gres on the granted node
(``--gres=gpu:h100:2 --nodelist=gpu-a``) and the lease in its comment
(``gpubroker-lease=<id>``), by which the broker tells its own jobs from work started
outside the hub and releases a lease whose job is gone. Slurm enforces the placement
(its cgroups, ``CUDA_VISIBLE_DEVICES``). While the job is pending the spawn page shows
Slurm's state and pending reason; ``sbatch``'s refusal is the spawn's error. The lease
follows the job: a job that ends (``poll``) gives the lease back, and a lease the broker
ends (idle reclaim, an admin) stops the server, which cancels the job (``scancel``).

The hub must load batchspawner's API handler (``import batchspawner`` in
``jupyterhub_config.py``), through which the job's server tells the hub its port.
A deployment's own ``c.SlurmSpawner.batch_script`` must keep ``{{gres}}`` and
``{{options}}``: the spawner puts the gres, node and comment there.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from batchspawner import SlurmSpawner
from traitlets import Unicode, default

from jupyter_gpubroker.engines.slurm import COMMENT_PREFIX, gres_request

from .environment import LEASE_ENV
from .spawner import GPUBrokerSpawnerMixin, SpawnError


class SlurmJobProgress(SlurmSpawner):
    """SlurmSpawner whose progress says what Slurm says of the job: pending and why
    (squeue's reason), running and where, instead of "Pending in queue..."."""

    batch_query_cmd = Unicode(
        "squeue -h -j {job_id} -o '%T %r %B'",
        help="Command to query the job: its state, pending reason and batch host.",
    ).tag(config=True)

    def job_message(self) -> tuple[str, bool]:
        """The job's state in words, and whether the job is past Slurm's queue."""
        job = f"Slurm job {self.job_id}"
        words = (self.job_status or "").split()
        if not self.job_id:
            return "Submitting the server's job to Slurm", False
        if self.state_isrunning():
            return f"{job} runs on {words[-1]}: waiting for the server to start", True
        if self.state_ispending() and len(words) >= 2:
            reason = words[1] if len(words) > 2 else ""
            why = f" ({reason})" if reason and reason != "None" else ""
            return f"{job} is {words[0].lower()} in Slurm's queue{why}", False
        if self.state_isunknown():
            return f"{job}: slurmctld does not answer ({self.job_status})", False
        return f"{job}: {self.job_status or 'no state yet'}", False

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        said = ""
        while True:
            message, past = self.job_message()
            if message != said:
                said = message
                yield {"progress": 80, "message": message}
            if past:
                return
            await asyncio.sleep(1)


class GPUBrokerSlurmSpawner(GPUBrokerSpawnerMixin, SlurmJobProgress):
    """SlurmSpawner with the server's GPU ordered by the broker (``"gpubroker-slurm"``):
    see the module's docstring."""

    def _device_env(self, devices: list[str] | None) -> dict[str, str]:
        return {}  # Slurm sets CUDA_VISIBLE_DEVICES for the job's gres

    def get_env(self) -> dict[str, str]:
        """The server's environment, with the hub's ``$SLURM_CONF`` whatever ``env_keep``
        says: batchspawner runs ``sbatch`` with this environment but ``squeue`` and
        ``scancel`` with the hub's, so a hub whose cluster's config is not ``/etc/slurm``
        would otherwise submit to one cluster and ask another."""
        env: dict[str, str] = super().get_env()
        if "SLURM_CONF" in os.environ:
            env.setdefault("SLURM_CONF", os.environ["SLURM_CONF"])
        return env

    def get_req_subvars(self) -> dict[str, Any]:
        """The job's substitutions, with a GPU server's gres, node and lease."""
        subvars: dict[str, Any] = super().get_req_subvars()
        held = self._gpu or {}
        if not held.get("lease_id"):
            return subvars
        try:
            node, gres = gres_request(held["devices"])
        except ValueError as e:
            raise SpawnError(
                f"The GPU broker granted devices that are no Slurm gres ({e}): set "
                "c.GPUBroker.inventory_source = 'slurm' in the broker service's config.",
                reason="gpubroker_config",
                status_code=503,
            ) from None
        subvars["gres"] = gres
        ours = (f"--nodelist={node}", f"--comment={COMMENT_PREFIX}{held['lease_id']}")
        subvars["options"] = " ".join(filter(None, (subvars.get("options"), *ours)))
        if LEASE_ENV not in subvars["keepvars"].split(","):  # a CPU server's list, kept
            subvars["keepvars"] += "," + LEASE_ENV
        return subvars

    async def submit_batch_script(self) -> str:
        try:
            job_id: str = await super().submit_batch_script()
        except RuntimeError as e:  # sbatch's own words, in one line, on the spawn page
            lines = (line.removeprefix("sbatch: error: ").strip() for line in str(e).splitlines())
            why = "; ".join(line.rstrip(".") for line in lines if line) or "sbatch failed"
            raise SpawnError(
                f"Slurm refused the server's job: {why}.",
                reason="sbatch",
                status_code=503,
            ) from None
        return job_id


class SimpleGPUBrokerSlurmSpawner(GPUBrokerSlurmSpawner):
    """Every job submitted as the hub's own OS user and run in ``home_dir_template``,
    for hub users without an OS account (demos and tests; ``"gpubroker-slurm-simple"``)."""

    exec_prefix = Unicode("", help="Submit as the hub's own OS user (no sudo).").tag(config=True)
    home_dir_template = Unicode(
        "/tmp/{username}", help="The job's working directory and HOME ({username} expanded)."
    ).tag(config=True)

    @default("req_homedir")
    def _home(self) -> str:
        return self.home_dir_template.format(username=self.user.name)

    def user_env(self, env: dict[str, str]) -> dict[str, str]:
        env["HOME"] = self.req_homedir
        return env

    async def submit_batch_script(self) -> str:
        os.makedirs(self.req_homedir, exist_ok=True)
        return await super().submit_batch_script()


__all__ = ["GPUBrokerSlurmSpawner", "SimpleGPUBrokerSlurmSpawner", "SlurmJobProgress"]
