"""DEMO: the GPU broker service's configuration (c.GPUBroker.*), read with --config."""

c = get_config()  # noqa: F821 - defined by the config loader

c.GPUBroker.simulate = "dgx-h100-mig"  # eight simulated H100s, each in seven 1g.10gb slices
c.GPUBroker.lease_ttl = 120
# every user's server runs as the hub's OS user (the demo's spawner), so the process a
# server's renewals name is that account's, whoever its hub user is
c.GPUBroker.holder_account = "broker"
# idle GPU servers: warned after an hour with no cell run and a quiet GPU, stopped 10 min
# later (an open browser tab does not count); the admin's are never culled
c.GPUBroker.server_idle_timeout = 3600
c.GPUBroker.grace = 600
c.GPUBroker.reclaim_exempt_users = {"admin"}
# how long a GPU session here usually lasts: the spawn page's ETAs rest on it until the
# broker has seen sessions end (without it, a new hub's ETAs say "unknown" at first)
c.GPUBroker.typical_hold = {"interactive": "2h"}
