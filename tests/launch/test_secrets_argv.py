"""Secrets never on a command line: during real runs (local; ssh with the OpenSSH client and with paramiko on real
sshd hosts in network namespaces) no process on the machine has an --env value in its argv, while every worker
has it in its environment. mpirun and srun: tests/engines/test_mpirun.py, tests/slurm/test_submit_slurm.py."""
from __future__ import annotations

import pytest

from tests.harness.netns import default_bashrc
from tests.launch.helpers import run_and_watch, secret_values
from tests.ports import free_port

# a login script that takes a moment (as pyenv's init does): the host's `bash -c '<shell line>'` stays in the
# process list that long, so a value in the shell line cannot slip by between two reads of /proc
SLOW_LOGIN = "sleep 0.5\n"


@pytest.mark.timeout(150)
def test_env_values_are_on_no_command_line_local(tmp_path):
    """Local: 2 workers under one agent get --env NAME (podrun's own value) in their environment; no argv holds it."""
    dump = tmp_path / "dump"
    dump.mkdir()
    run_and_watch(["--devices-per-host", "2", "--runs-dir", str(tmp_path / "runs"), "--master-port",
                    str(free_port())], secret_values(), dump, 2)


@pytest.mark.cluster
@pytest.mark.timeout(240)
@pytest.mark.parametrize("client", ["openssh", "paramiko"])
def test_env_values_are_on_no_command_line_over_ssh(make_ssh_hosts, tmp_path, client):
    """ssh, 2 hosts whose login script is slow: the agents get the --env over their stdin; neither the ssh clients
    here nor the shells and agents on the hosts hold a value in their argv, and every worker has them."""
    hosts = make_ssh_hosts(2, bashrc=default_bashrc() + SLOW_LOGIN)
    dump = tmp_path / "dump"
    dump.mkdir()
    run_and_watch(["--hosts", ",".join(hosts.hosts), "--devices-per-host", "1", "--transport", "ssh",
                    "--ssh-config", str(hosts.ssh_config_path), "--ssh-client", client, "--python", hosts.python,
                    "--runs-dir", str(tmp_path / "runs"), "--master-port", str(free_port())],
                   secret_values(), dump, 2)
