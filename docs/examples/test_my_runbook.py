from pathlib import Path

from executor.faces.testing import h200_probe
from executor.transport.scripted import Answer

RUNBOOK = Path(__file__).with_name("my_runbook.yaml")


def test_a_dead_mirror_is_retried_then_the_fallback_fetches(runbook_offline):
    gpu = runbook_offline.host("gpu")
    gpu.program("probe", h200_probe())  # the probe program's answer, as a document
    gpu.on(r"^curl ", Answer(exit_code=7, stderr="curl: (7) Failed to connect"))
    gpu.on(r"^wget ", stdout="")
    gpu.on(r"warm_up", stdout='{"tokens_per_s": 850}')

    run = runbook_offline.run(RUNBOOK)

    assert run.exit_code == 0
    assert run.ran("passed") == ["probe", "fetch", "warm_up"]
    assert (run.step("fetch").via, run.step("fetch").attempts) == ("fallback 1", 4)
    assert [c.script.split()[0] for c in gpu.commands[1:5]] == ["curl", "curl", "curl", "wget"]


def test_a_host_without_gpus_stops_at_the_probe(runbook_offline):
    probe = h200_probe()
    probe["gpu"]["gpus"] = []
    runbook_offline.host("gpu").program("probe", probe)

    run = runbook_offline.run(RUNBOOK)

    assert run.exit_code == 1
    assert run.ran() == ["probe"]
    assert "no GPU on the host" in run.step("probe").message
