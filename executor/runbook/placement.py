"""Where a placed matrix group's instances run (`placement: spread`): each server configuration on one host.

A *unit* is a server instance with the instances that run against it (`Instance.server`): they need that
server, so they share its host. An instance before the server (a download per drafter, say) goes to every
host whose units share a cell with it, so each host that needs the weights fetches them once; any other
instance is a unit of its own. Units keep the host a resumed run gave them (`previous`), so a server
still running there is adopted; a new unit goes to the pool host with the fewest units, ties by pool
order. Pure and deterministic: the engine calls it at the start of a run (README, "Matrices").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from executor.runbook.campaign import Instance, MatrixGroup


def place(
    group: MatrixGroup,
    instances: Mapping[str, Instance],
    previous: Mapping[str, str],
    needs: Mapping[str, Collection[str]] | None = None,
) -> dict[str, list[str]]:
    """Instance id -> the hosts it runs on, for every instance of `group` (in its run order).

    `previous`: unit (server instance) id -> host, from the run being resumed; a host no longer in the
    pool is not kept. `needs`: instance id -> the steps it needs (`cells.Index.needs`); in a group
    without a server an instance joins the unit of the mates it needs, so it reads their facts on its
    host after they ran there, not on another host while they run.
    """
    pool = list(group.pool)
    if not pool:
        return {}
    units: dict[str, list[str]] = {server: [] for server in group.servers}
    unit_of: dict[str, str] = {}  # without a server: an instance's unit
    shared: list[str] = []  # before the server: placed where the units that share its cells are
    for iid in group.instances:
        server = instances[iid].server
        if server is not None:
            units.setdefault(server, []).append(iid)
        elif group.servers:  # every cell has a server instance: some unit shares a cell with it
            shared.append(iid)
        else:
            joined = list(dict.fromkeys(unit_of[n] for n in sorted((needs or {}).get(iid, ())) if n in unit_of))
            unit = joined[0] if joined else iid
            units.setdefault(unit, [])
            for other in joined[1:]:  # it needs two units: they become one, on one host
                for member in units.pop(other):
                    units[unit].append(member)
                    unit_of[member] = unit
            units[unit].append(iid)
            unit_of[iid] = unit
    load = dict.fromkeys(pool, 0)
    host_of: dict[str, str] = {}
    for unit in units:  # those a resumed run placed keep their host
        if previous.get(unit) in load:
            host_of[unit] = previous[unit]
            load[previous[unit]] += 1
    for unit in units:
        if unit not in host_of:
            host = min(pool, key=lambda name: (load[name], pool.index(name)))
            host_of[unit] = host
            load[host] += 1
    placed = {iid: [host_of[unit]] for unit, members in units.items() for iid in members}
    for iid in shared:
        cells = set(instances[iid].cells)
        hosts = {host_of[s] for s in group.servers if cells & set(instances[s].cells)}
        placed[iid] = [name for name in pool if name in hosts]
    return {iid: placed[iid] for iid in group.instances}
