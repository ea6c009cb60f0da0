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

``hub_spawner.configure`` sets up the broker's part (docs/hub.md shows what it fills in,
for those who write it by hand). The broker runs as the hub-managed
service "gpubroker" on a simulated DGX H100 whose
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
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

from hub_spawner import configure

c = get_config()  # noqa: F821 - defined by the config loader

configure(
    c,
    broker_config=str(Path(__file__).with_name("gpubroker_config.py")),
    # what the hub and the broker write goes here, never into the directory it starts in
    run_dir=os.environ.get("GPUBROKER_EXAMPLE_DIR")
    or str(Path(jupyter_data_dir(), "gpubroker-hub-example")),
    admin_users=["admin"],  # custom:gpubroker:admin; every user gets custom:gpubroker:use
    spawner="hub_spawner.spawner.SimpleGPUBrokerSpawner",  # every server as this OS user
)
# the hub, for a demo only: any user name, any password, on 127.0.0.1 only
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {"admin"}
if os.geteuid() == 0:  # as root (a container, CI) the servers run as root too
    c.Spawner.args = ["--allow-root"]
