"""The click options of `podrun launch` that choose how podrun reaches the hosts and which network the workers use."""
from __future__ import annotations

import click

from podrun.launch.transports.ssh_common import SSH_CLIENTS


def network_options(f):
    """click options for `podrun launch`: the ssh client."""
    opts = [
        click.option("--ssh-client", type=click.Choice(SSH_CLIENTS), default="auto", show_default=True,
                     help="Which ssh client the ssh transport runs: openssh (the system's ssh, so every "
                          "ssh_config directive works: ProxyJump, certificates, ssh-agent, Match), paramiko "
                          "(no ProxyJump/ProxyCommand), auto (openssh when ssh is on PATH)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


NETWORK_OPTION_NAMES = ("ssh_client",)


def pop_network_options(kwargs: dict) -> dict:
    return {k: kwargs.pop(k) for k in NETWORK_OPTION_NAMES if k in kwargs}
