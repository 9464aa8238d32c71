"""The click options of `podrun launch` that choose how podrun reaches the hosts and which network the workers use."""
from __future__ import annotations

import click

from podrun.cli.options import stacked
from podrun.launch.transports import SSH_CLIENTS
from podrun.specs.cluster import IFNAME_RE


class InterfaceName(click.ParamType):
    """A network interface name as Linux allows it (at most 15 characters, no '/' or whitespace)."""

    name = "interface"

    def convert(self, value, param, ctx):
        if not IFNAME_RE.fullmatch(str(value)):
            self.fail(f"{str(value)[:40]!r} is not a network interface name (at most 15 letters, digits or _.:@-; "
                      "e.g. ib0 or eth1, as `ip -br addr` shows it on the hosts)", param, ctx)
        return str(value)


# `podrun launch`'s options for the ssh client and the workers' network
network_options = stacked(
    click.option("--ssh-client", type=click.Choice(SSH_CLIENTS), default="auto", show_default=True,
                 help="Which ssh client the ssh transport runs: openssh (the system's ssh, so every "
                      "ssh_config directive works: ProxyJump, certificates, ssh-agent, Match), paramiko "
                      "(no ProxyJump/ProxyCommand), auto (openssh when ssh is on PATH)."),
    click.option("--data-interface", type=InterfaceName(), default=None,
                 help="The interface of the network the hosts share for collectives (e.g. ib0, eth1): every "
                      "worker gets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, and over ssh MASTER_ADDR is the "
                      "master host's address on it; preflight checks every host reaches it. Default: the "
                      "cluster spec's data_interface."),
)

