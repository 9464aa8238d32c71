"""Which ssh client runs the ssh transport: OpenSSH's ``ssh`` binary or paramiko, chosen per request."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from podrun.launch.request import LaunchRequest
    from podrun.launch.transports.ssh_common import HeldAgentTransport

SSH_CLIENTS = ("auto", "openssh", "paramiko")


def ssh_transport(request: "LaunchRequest") -> "HeldAgentTransport":
    """The ssh transport for ``request.ssh.client``: ``openssh`` (the system's ssh), ``paramiko``, or ``auto``
    (OpenSSH's client when ``ssh`` is on PATH, as mpirun, pdsh and Ansible use it; else paramiko)."""
    from podrun.launch.transports.openssh import OpenSSHTransport, ssh_binary

    client = request.ssh.client
    if client == "openssh" or (client == "auto" and ssh_binary() is not None):
        return OpenSSHTransport(request)
    from podrun.launch.transports.ssh import SSHTransport

    return SSHTransport(request)
