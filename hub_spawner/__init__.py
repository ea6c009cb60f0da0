"""JupyterHub integration for jupyter-gpubroker.

Not built yet: the spawner mixin, hub service glue and admin pages come once
the broker's HTTP API has settled (see the project's issues). The package
exists now so the wheel's layout is final.
"""
