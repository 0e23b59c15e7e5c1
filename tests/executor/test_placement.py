"""`place`: each server configuration of a placed matrix on one pool host, balanced, sticky, deterministic."""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from executor.runbook import cells
from executor.runbook.loader import Runbook, parse_runbook
from executor.runbook.placement import place


def sweep(drafters: int, tokens: int, pool: int = 3) -> Runbook:
    hosts = ", ".join(f"gpu{i}: {{address: 127.0.0.1}}" for i in range(1, pool + 1))
    names = ", ".join(f"gpu{i}" for i in range(1, pool + 1))
    text = textwrap.dedent(
        f"""\
        name: pool
        hosts: {{{hosts}}}
        steps:
          - group: g
            matrix:
              drafter: [{", ".join(f"d{i}" for i in range(drafters))}]
              tokens: [{", ".join(str(4 * (i + 1)) for i in range(tokens))}]
              concurrency: [1, 8]
            hosts: [{names}]
            placement: spread
            steps:
              - id: download
                kind: shell
                script: echo $matrix_drafter
              - id: deploy
                kind: deploy
                model_path: /m
                tp_size: 1
                draft_model_path: /d/${{{{ matrix.drafter }}}}
                speculative_algorithm: DFLASH
                speculative_num_draft_tokens: ${{{{ matrix.tokens }}}}
              - id: bench
                kind: eval_acceptance
                server: deploy
                max_new_tokens: ${{{{ matrix.concurrency }}}}
        """
    )
    return parse_runbook(text, Path("pool.yaml"))


def test_units_share_their_server_host_and_downloads_go_where_they_are_needed() -> None:
    runbook = sweep(drafters=2, tokens=2)
    (group,) = runbook.groups
    placed = place(group, runbook.instances, {})
    assert list(placed) == list(group.instances)
    servers = [placed[s][0] for s in group.servers]
    assert servers == ["gpu1", "gpu2", "gpu3", "gpu1"]  # fewest units first, ties by pool order
    for iid, instance in runbook.instances.items():
        if instance.server is not None:
            assert placed[iid] == placed[instance.server]
    # d0's servers are on gpu1 and gpu2, d1's on gpu3 and gpu1: each host downloads what it serves
    assert placed["download[drafter=d0]"] == ["gpu1", "gpu2"]
    assert placed["download[drafter=d1]"] == ["gpu1", "gpu3"]


def test_previous_hosts_are_kept_and_new_units_balance_around_them() -> None:
    runbook = sweep(drafters=2, tokens=2)
    (group,) = runbook.groups
    first, second = group.servers[:2]
    previous = {first: "gpu3", second: "gpu3", "deploy[drafter=gone,tokens=4]": "gpu1"}
    placed = place(group, runbook.instances, previous)
    assert placed[first] == ["gpu3"] and placed[second] == ["gpu3"]
    assert [placed[s][0] for s in group.servers[2:]] == ["gpu1", "gpu2"]
    assert place(group, runbook.instances, {first: "gone-host"})[first] == ["gpu1"]  # no longer in the pool


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 4))
def test_balanced_and_deterministic(drafters: int, tokens: int, pool: int) -> None:
    runbook = sweep(drafters, tokens, pool)
    (group,) = runbook.groups
    placed = place(group, runbook.instances, {})
    assert placed == place(group, runbook.instances, {})
    load = Counter(placed[s][0] for s in group.servers)
    assert max(load.values()) - min(load.get(h, 0) for h in group.pool) <= 1


def test_without_a_server_an_instance_goes_to_the_host_of_the_mates_it_needs() -> None:
    """Each instance of a serverless group used to be a unit of its own, so `bench` of a cell could run on
    another host, at the same time as the `up` its gate reads (seen: `steps.up.status = "running"`)."""
    text = textwrap.dedent(
        """\
        name: pool
        hosts: {gpu1: {address: 127.0.0.1}, gpu2: {address: 127.0.0.2}}
        steps:
          - group: g
            matrix: {srv: [a, b, c], conc: [1, 2]}
            hosts: [gpu1, gpu2]
            placement: spread
            steps:
              - {id: up, kind: shell, script: echo $matrix_srv}
              - {id: bench, kind: shell, script: echo $matrix_conc, gates: ["steps.up.status == 'passed'"]}
              - {id: alone, kind: shell, script: echo $matrix_srv $matrix_conc}
        """
    )
    runbook = parse_runbook(text, Path("pool.yaml"))
    (group,) = runbook.groups
    index = cells.Index(runbook)
    placed = place(group, runbook.instances, {}, index.needs(group))
    for srv in ("a", "b", "c"):
        for conc in (1, 2):
            assert placed[f"bench[srv={srv},conc={conc}]"] == placed[f"up[srv={srv}]"]
    assert {hosts[0] for hosts in placed.values()} == {"gpu1", "gpu2"}  # still spread
