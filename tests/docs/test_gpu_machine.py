"""docs/gpu-machine.md holds: its broker config and quotas file, read as the hub service
reads them, start a broker with those quotas and limits (on simulated GPUs); its hub
config is accepted by JupyterHub; and each command it shows is marked as one for the GPU
machine or is run by a test."""

from __future__ import annotations

import re
from pathlib import Path

from jupyterhub.app import JupyterHub
from traitlets.config import Config

from hub_spawner.service import GPUBrokerService
from jupyter_gpubroker.broker.models import JobClass
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.wire.sizes import Size

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "gpu-machine.md").read_text()
MARK = "On the GPU machine:"


def block(first_line: str) -> str:
    """The code block of the page that starts with ``first_line`` (the file it shows)."""
    (found,) = re.findall(rf"```\w+\n({re.escape(first_line)}\n.*?)```", PAGE, re.S)
    return found


def test_the_pages_broker_config_and_quotas_start_a_broker_with_them(tmp_path: Path) -> None:
    config = tmp_path / "gpubroker_config.py"
    config.write_text(block("# /etc/gpubroker/gpubroker_config.py"))
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(block("# /etc/gpubroker/quotas.yaml"))
    service = GPUBrokerService()
    service.load_config_file(str(config))  # as the service reads its --config
    assert service.config.GPUBroker.quotas_file == "/etc/gpubroker/quotas.yaml"
    service.config.GPUBroker.quotas_file = str(quotas)  # the page's paths are the machine's
    service.config.GPUBroker.state_file = str(tmp_path / "state.sqlite")
    rt = GPUBroker(config=service.config, simulate="dgx-h100-mig")
    rt.start()
    try:
        set_ = rt.core.quotas()
        assert (set_[("user", "alice")].share, set_[("user", "alice")].max_gpus) == (2, 1)
        assert (set_[("group", "lab-a")].gpu_hours, set_[("group", "lab-a")].period_s) == (
            100,
            604800,
        )
        assert (rt.idle_timeout, rt.grace) == (1200, 600)  # "20 minutes", "10 minutes later"
        check = rt.core.limits.check
        assert check(JobClass("interactive"), Size.parse("1g.10gb"), [], None) == 4 * 3600
        assert check(JobClass("batch"), Size.parse("gpus=1"), [], 2 * 86400) == 2 * 86400
    finally:
        rt.stop()


def test_the_pages_hub_config_is_one_jupyterhub_accepts() -> None:
    c = Config()
    exec(block("# /etc/jupyterhub/jupyterhub_config.py"), {"get_config": lambda: c})
    hub = JupyterHub(config=c)  # the traits validate
    (service,) = c.JupyterHub.services
    assert "--config=/etc/gpubroker/gpubroker_config.py" in service["command"]
    authenticator = hub.authenticator_class(config=c)  # the hub's default: PAM
    assert authenticator.allow_all and authenticator.admin_users == {"alice"}
    admins = [r for r in c.JupyterHub.load_roles if r["name"] == "gpubroker-admin"]
    assert admins[0]["users"] == ["alice"]


def test_each_command_the_page_shows_is_marked_for_the_gpu_machine_or_run_by_a_test() -> None:
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    unmarked = []
    for before, commands in re.findall(r"([^\n]*)\n\n```bash\n(.*?)```", PAGE, re.S):
        for command in filter(str.strip, commands.splitlines()):
            if before != MARK and f'"{command}"' not in sources:
                unmarked.append(command)
    assert re.findall(r"```bash\n", PAGE) and unmarked == []
