"""The `hosts` command: the hosts podrun would use and where it found them (--hosts, --hostfile, scheduler env, cluster spec)."""
from __future__ import annotations

import click

from podrun.cli.options import host_options, pop_plan_options
from podrun.cli.render import print_json


@click.command("hosts")
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print source, scheduler and hosts [{name, slots}] as JSON.")
def hosts(as_json: bool, **kwargs) -> None:
    """Show the hosts podrun would use and where it found them.

    The first of these wins: --hosts, --hostfile, the scheduler allocation this shell runs in
    (SLURM_JOB_NODELIST, PBS_NODEFILE, PE_HOSTFILE, SGE_JOB_HOSTLIST), the cluster spec.

    \b
      podrun hosts                     # inside `salloc -N 4` or a batch job
      podrun hosts --cluster abci --nodes 4 --json
    """
    from podrun.cli.options import resolve_plan
    from podrun.specs.allocation import compress_hostlist

    plan, spec, _, src = resolve_plan(None, pop_plan_options(kwargs))
    used = list(dict.fromkeys(plan.hosts))
    slots = {e.name: e.slots for e in src.hosts}
    rows = [{"name": name, "slots": slots.get(name)} for name in used]
    found = src.discovered
    if found is not None and found.scheduler_slots:
        sched_slots = dict(zip(found.names, found.scheduler_slots))
        for row in rows:
            row["scheduler_slots"] = sched_slots.get(row["name"])
    if as_json:
        print_json({
            "source": src.source,
            "scheduler": src.scheduler,
            "cluster": spec.name,
            "devices_per_host": plan.devices_per_host,
            "device_kind": plan.device_kind,
            "nodelist": compress_hostlist(used),
            "hosts": rows,
        })
        return
    where = src.source + (f" ({src.scheduler} allocation)" if src.scheduler != "none" else "")
    of = f" of {len(src.hosts)}" if len(used) < len(src.hosts) else ""
    click.echo(f"{len(used)}{of} host(s) from {where}, {plan.devices_per_host} {plan.device_kind} device(s) each "
               f"(cluster {spec.name}): {compress_hostlist(used)}")
    for row in rows:
        extra = [f"{said}={row[k]}" for k, said in (("slots", "slots"), ("scheduler_slots", "scheduler slots"))
                 if row.get(k) is not None]
        click.echo(f"  {row['name']}" + (f"  {' '.join(extra)}" if extra else ""))
