"""Commands about this machine's Jupyter, not a broker: GPU kernelspecs and the demo."""

from __future__ import annotations

import argparse
import sys
import textwrap

from ..wire.sizes import memory_option


def add_kernelspec(p: argparse.ArgumentParser) -> None:
    ks_sub = p.add_subparsers(metavar="ACTION")
    install = ks_sub.add_parser(
        "install",
        help="install a kernelspec whose kernels start on a granted GPU",
        description="Install e.g. 'Python 3 (GPU 1g.10gb)': its kernels queue for the size "
        "given and start with the device attached.",
    )
    what = install.add_mutually_exclusive_group(required=True)
    what.add_argument("--gpu", metavar="PROFILE", help="a MIG profile, e.g. 1g.10gb")
    what.add_argument("--gpus", type=int, help="a number of whole GPUs")
    what.add_argument(
        "--min-memory", type=memory_option, metavar="GB", help="any device with this much memory"
    )
    what.add_argument(
        "--share",
        type=memory_option,
        metavar="GB",
        help="this much of a GPU shared with other kernels",
    )
    what.add_argument(
        "--on-demand",
        action="store_true",
        help="no GPU at start: the notebook asks with %%gpu request",
    )
    install.add_argument(
        "--compute", type=int, metavar="PERCENT", help="with --share: the most of its compute"
    )
    install.add_argument(
        "--class", dest="job_class", default="interactive", choices=["interactive", "batch"]
    )
    install.add_argument("--name", help="kernelspec name (default python3-gpu-<size>)")
    install.add_argument("--display-name", help="name shown in the launcher")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for this user only")
    where.add_argument("--prefix", help="install under this prefix")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix")
    install.set_defaults(func=cmd_kernelspec_install)


def add_demo(p: argparse.ArgumentParser) -> None:
    from ..nvml.presets import PRESETS  # this command's only: it starts the simulation

    p.formatter_class = argparse.RawDescriptionHelpFormatter  # the machines' lines as written
    p.description = textwrap.fill(
        "Start JupyterLab with the embedded broker on a simulated machine, in a "
        "temporary directory holding the GPU kernelspecs, the state file and a copy of the "
        "tour, which it opens. Ctrl-C or SIGTERM stops it and removes that directory."
    )
    machines = [(name, topology.describe()) for name, topology in PRESETS.items()]
    machines += [
        ("NAME:N", "any of them with N GPUs, e.g. dgx-h100-mig:2"),
        ("FILE.yaml", "a topology file of your own (docs/hardware.md)"),
    ]
    p.epilog = "simulated machines (--simulate):\n" + "\n".join(
        textwrap.fill(said, 79, initial_indent=f"  {name:<19} ", subsequent_indent=" " * 22)
        for name, said in machines
    )
    p.add_argument(
        "--simulate",
        default="dgx-h100-mig",
        metavar="TOPOLOGY",
        help="the simulated machine, one of those below (default dgx-h100-mig)",
    )
    p.add_argument(
        "--port", type=int, help="default: $JUPYTER_PORT, else 8888 or the next free port"
    )
    p.add_argument("--no-browser", action="store_true")
    p.add_argument(
        "--suspend",
        action="store_true",
        help="suspend idle GPU kernels (one-minute idle timeout, 30 s of grace) and resume "
        "them on their next cell; whole GPUs only (e.g. --simulate dgx-h100)",
    )
    p.add_argument(
        "--server", action="store_true", help="start a plain jupyter server instead of JupyterLab"
    )
    p.set_defaults(func=cmd_demo)


def cmd_kernelspec_install(args: argparse.Namespace) -> int:
    from .. import kernelspec
    from ..wire.sizes import Size

    size: Size | None
    if args.compute is not None and args.share is None:
        Size(compute_percent=args.compute)  # refused: a cap of a share only
    if args.on_demand:
        size = None
    elif args.gpu:
        size = Size(profile=args.gpu)
    elif args.gpus is not None:
        size = Size(gpus=args.gpus)
    elif args.share is not None:
        size = Size(share_gb=args.share, compute_percent=args.compute)
    else:
        size = Size(min_memory_gb=args.min_memory)

    path = kernelspec.install(
        size,
        args.job_class,
        name=args.name,
        display_name=args.display_name,
        user=args.user,
        prefix=sys.prefix if args.sys_prefix else args.prefix,
    )
    print(f"installed {kernelspec.spec_for(size, args.job_class)[1]['display_name']} in {path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    return run_demo(
        args.simulate,
        port=args.port,
        browser=not args.no_browser,
        lab=not args.server,
        suspend=args.suspend,
    )
