"""Host discovery inside an allocation: PBS_NODEFILE, PE_HOSTFILE, SGE_JOB_HOSTLIST and the env order."""
from __future__ import annotations

import pytest

from podrun.errors import HostError
from podrun.specs.allocation import (
    HostEntry, discover, read_pbs_nodefile, read_pe_hostfile, read_sge_hostlist,
)


def test_pbs_nodefile_dedupes_in_order_and_counts_slots(tmp_path):
    f = tmp_path / "nodefile"
    f.write_text("n02\nn02\nn01\nn02\nn03\n\n")
    assert read_pbs_nodefile(str(f)) == (HostEntry("n02", 3), HostEntry("n01", 1), HostEntry("n03", 1))


def test_pe_hostfile_reads_host_slots_queue(tmp_path):
    f = tmp_path / "pe"
    f.write_text("g0003.abci.local 40 gpu@g0003 UNDEFINED\ng0001.abci.local 40 gpu@g0001 UNDEFINED\n"
                 "g0003.abci.local 4 other@g0003 UNDEFINED\n")
    assert read_pe_hostfile(str(f)) == (HostEntry("g0003.abci.local", 44), HostEntry("g0001.abci.local", 40))


def test_sge_job_hostlist_one_host_per_line(tmp_path):
    f = tmp_path / "hl"
    f.write_text("g0002\ng0005\ng0002\n")
    assert read_sge_hostlist(str(f)) == (HostEntry("g0002"), HostEntry("g0005"))


@pytest.mark.parametrize(
    "reader, text, part",
    [
        (read_pe_hostfile, "g0001 forty gpu@g0001 UNDEFINED\n", ":1: expected 'HOST SLOTS QUEUE PROCESSORS'"),
        (read_pe_hostfile, "g0001\n", ":1: expected"),
        (read_pbs_nodefile, "n01\nn02 n03\n", ":2: expected one host name per line"),
        (read_pbs_nodefile, "\n\n", "lists no hosts"),
        (read_sge_hostlist, "g0001\n`reboot`\n", ":2: '`reboot`' is not a valid host name"),
    ],
)
def test_malformed_files_name_the_file_line_and_part(tmp_path, reader, text, part):
    f = tmp_path / "bad"
    f.write_text(text)
    with pytest.raises(HostError) as err:
        reader(str(f))
    assert str(f) in err.value.message and part in err.value.message


def test_missing_file_names_variable_and_path(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(HostError) as err:
        discover({"PBS_NODEFILE": missing})
    assert f"PBS_NODEFILE={missing}" in err.value.message and err.value.exit_code == 2


def test_discover_slurm_nodelist():
    d = discover({"SLURM_JOB_NODELIST": "g[0001-0003,0007],h5", "SLURM_JOB_ID": "12"})
    assert d.scheduler == "slurm" and d.source == "SLURM_JOB_NODELIST"
    assert d.names == ("g0001", "g0002", "g0003", "g0007", "h5")
    assert d.to_dict()["hosts"][0] == {"name": "g0001", "slots": None, "scheduler_slots": None}


def test_discover_older_slurm_variable_and_malformed_value():
    assert discover({"SLURM_NODELIST": "a[1-2]"}).names == ("a1", "a2")
    with pytest.raises(HostError, match="SLURM_JOB_NODELIST.*never closed"):
        discover({"SLURM_JOB_NODELIST": "a[1-2"})


def test_discover_order_and_sources(tmp_path):
    pbs = tmp_path / "pbs"
    pbs.write_text("p1\np1\np2\n")
    pe = tmp_path / "pe"
    pe.write_text("u1 40 all.q@u1 UNDEFINED\n")
    hl = tmp_path / "hl"
    hl.write_text("s1\ns2\n")
    assert discover({}) is None
    assert discover({"SLURM_JOB_NODELIST": "  "}) is None          # empty counts as unset
    assert discover({"SLURM_JOB_NODELIST": "x1", "PBS_NODEFILE": str(pbs)}).source == "SLURM_JOB_NODELIST"
    d = discover({"PBS_NODEFILE": str(pbs), "PE_HOSTFILE": str(pe)})
    assert (d.scheduler, d.source, d.path, d.names) == ("pbs", "PBS_NODEFILE", str(pbs), ("p1", "p2"))
    # scheduler slots (MPI ranks / cores) are not devices: kept apart from HostEntry.slots
    assert [h.slots for h in d.hosts] == [None, None] and d.scheduler_slots == (2, 1)
    assert d.to_dict()["hosts"][0] == {"name": "p1", "slots": None, "scheduler_slots": 2}
    d = discover({"PE_HOSTFILE": str(pe), "SGE_JOB_HOSTLIST": str(hl)})
    assert (d.scheduler, d.source, d.names) == ("uge", "PE_HOSTFILE", ("u1",))
    d = discover({"SGE_JOB_HOSTLIST": str(hl)})
    assert (d.scheduler, d.source, d.names) == ("uge", "SGE_JOB_HOSTLIST", ("s1", "s2"))
