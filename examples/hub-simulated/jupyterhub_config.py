"""DEMO: a JupyterHub sharing one simulated GPU machine through the GPU broker service.

    jupyterhub -f examples/hub-simulated/jupyterhub_config.py

then open http://127.0.0.1:8000 and log in as any user name with any password (the
dummy authenticator: a demo, never for a hub other people can reach; it listens on
127.0.0.1 only). "admin" is the hub's and the broker's admin. Needs
configurable-http-proxy on PATH (npm install -g configurable-http-proxy).

Run it from any directory: what the hub and the broker write (the hub's database and
cookie secret, the proxy's pid file, the broker's state) goes to
$GPUBROKER_EXAMPLE_DIR, else <jupyter data dir>/gpubroker-hub-example, never to the
directory it was started in. As root (a container, CI) the servers run as root too.

The broker runs as the hub-managed service "gpubroker" on a simulated DGX H100 whose
eight GPUs are cut in MIG slices (gpubroker_config.py), its state in gpubroker.sqlite
there, its API at /services/gpubroker/api/v1/. Every user
may use it (custom:gpubroker:use), the admin administers it (custom:gpubroker:admin).
Single-user servers (the GPU spawner over LocalProcessSpawner, all as this OS user: a demo
too) start CPU-only or with a GPU or MIG slice of their own, chosen on the spawn page's
form, waiting in the broker's queue with its position and ETA on the spawn page; they find
the broker in $GPUBROKER_URL and call it with their own $JUPYTERHUB_API_TOKEN.
Their GPU kernels (in a CPU-only server) need the GPU kernelspecs installed once where
every server finds them:

    jupyter gpubroker kernelspec install --gpu 1g.10gb --sys-prefix
    jupyter gpubroker kernelspec install --on-demand --sys-prefix
"""

import os
import sys
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

from hub_spawner.culling import gpu_announcement

c = get_config()  # noqa: F821 - defined by the config loader

HERE = Path(__file__).resolve().parent
ADMIN = "admin"
USE, ADMINISTER = "custom:gpubroker:use", "custom:gpubroker:admin"
SERVICE = "gpubroker"
SERVICE_URL = "http://127.0.0.1:10101"
ACCESS = f"access:services!service={SERVICE}"

# -- what the example writes, outside the directory it is started in
RUN = Path(
    os.environ.get("GPUBROKER_EXAMPLE_DIR") or Path(jupyter_data_dir(), "gpubroker-hub-example")
)
RUN.mkdir(parents=True, exist_ok=True)
c.JupyterHub.db_url = f"sqlite:///{RUN / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(RUN / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(RUN / "jupyterhub-proxy.pid")

# -- the hub, for a demo only
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.authenticator_class = "dummy"  # DEMO: any user name, any password
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {ADMIN}
# the GPU spawner over SimpleLocalProcessSpawner (every server as this OS user, homes in
# /tmp; "gpubroker" once installed, or GPUBrokerSpawner for real OS users)
c.JupyterHub.spawner_class = "hub_spawner.spawner.SimpleGPUBrokerSpawner"
if os.geteuid() == 0:  # DEMO as root (a container, CI): the servers run as root too
    c.Spawner.args = ["--allow-root"]
c.Spawner.start_timeout = 120  # once the GPU is granted; the queue's wait comes on top
c.SimpleGPUBrokerSpawner.gpu_wait_timeout = 1800
# an idle GPU server's warning, then why it was stopped, on the hub's pages
c.JupyterHub.template_vars = {"announcement": gpu_announcement}

# -- the broker's permissions: custom scopes the service enforces
c.JupyterHub.custom_scopes = {
    USE: {"description": "Request, hold and release GPUs through the GPU broker."},
    ADMINISTER: {
        "description": "Administer the GPU broker: everyone's requests and leases, quotas.",
        "subscopes": [USE],
    },
}
c.JupyterHub.load_roles = [
    {"name": "user", "scopes": ["self", ACCESS, USE]},
    {"name": "gpubroker-admin", "scopes": [ADMINISTER], "users": [ADMIN]},
    # the service reads the hub groups of users whose kernels call it with kernel tokens
    {
        "name": "gpubroker-service",
        "scopes": ["read:users:groups", "read:servers"],
        "services": [SERVICE],
    },
]

# -- the broker: one process for the whole hub
c.JupyterHub.services = [
    {
        "name": SERVICE,
        "url": SERVICE_URL,
        "command": [
            sys.executable,
            "-m",
            "hub_spawner.service",
            f"--config={HERE / 'gpubroker_config.py'}",
            f"--GPUBroker.state_file={RUN / 'gpubroker.sqlite'}",
        ],
        "display": True,  # in the hub's Services menu: the service's page, logged in by OAuth
        "oauth_no_confirm": True,  # the admin deployed it: no consent page
        "oauth_client_allowed_scopes": [USE, ADMINISTER],  # what a user holds of them
    },
]

# -- single-user servers reach the service with their own token
c.Spawner.environment = {"GPUBROKER_URL": f"{SERVICE_URL}/services/{SERVICE}/api/v1"}
c.Spawner.server_token_scopes = [
    "users:activity!user",  # the defaults of the 'server' role
    "access:servers!server",
    ACCESS,
    USE,
    ADMINISTER,  # only for users who hold it (the admin)
]
