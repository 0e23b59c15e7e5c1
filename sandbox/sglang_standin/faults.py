"""The stand-in server's switches: `$HOME/sglang-standin.json` on the test host (TEST DOUBLE).

A JSON object; a missing file means the defaults. Keys (all optional):

- `fault`: null | "crash_at_startup" | "never_healthy" | "refuse_flush_cache", or one of a multi-node
  launch's (`--nnodes` > 1; distributed.py), for the node whose HOME holds the file: "nccl_error" (dies
  with NCCL's error after "Init nccl begin."), "nccl_hang" (prints "Init nccl begin." and nothing more),
  "wrong_tp" (joins claiming another tp size; node 0 refuses it); "miscount_metrics": /metrics counts each
  request's verify calls twice, so its counters disagree with meta_info and /server_info (a disagreement planted
  for the report to flag; metrics.py);
- `accept_length`: null (per-prompt defaults by kind of prompt) or the mean acceptance length
  to simulate (float, clamped to [1, draft token count]);
- `decode_tokens_per_s`: one request's decode speed without speculative decoding (float > 0);
- `startup_s`: seconds from launch until /health answers 200 (float >= 0);
- `stream_interval`: stream an output every this many tokens (int >= 1, default 1), as SGLang's
  `--stream-interval` does; the demo streams every 16, so that its numbers are the simulation's times and
  not the controller's CPU parsing one HTTP chunk per token (a 2-core machine's load made every point noisy);
- `modelled_clock`: false (default) or true: each streamed output tells its time on the simulation's clock
  (`meta_info.standin_model_s`, seconds since the request arrived: a field of the stand-in's own, no real
  SGLang sends it), and the stand-in's bench_serving, seeing it on every output, times the run on it instead of
  the wall (bench_client.py): the numbers are then the simulated engine's, not the CPU left to a loaded
  controller running the server and the client (the demo's 8x fewer, a shared 2-core machine's every point
  "(noisy)"). The server still paces the requests in real time, so as many are in flight as the model says;
- `broken_drafter`: false (default) or true: a speculative server's greedy outputs then differ from
  the baseline's from an early token index on (simulation.divergence_index, per prompt), as a
  drafter whose verification lets wrong tokens through would; a baseline server ignores it;
- the landscape (simulation.Physics; defaults: simulation.py's constants, an 8x H200 serving Kimi-K2.6), so that a
  campaign has another optimum: `tree_gain` (>= 0, default 0.12: DDTREE's acceptance beyond the bonus token, per
  doubling of its budget over 8), `verify_cost_per_token` (>= 0, default 0.0375: a verify step's cost in decode
  steps per token verified, beyond the one step), `batch_slowdown` (>= 0, default 0.1: a speculative step's
  slowdown per extra request in flight, per 8 tokens verified; the baseline's stays 0.02), `drafter_profiles`
  (null: simulation.DRAFTER_PROFILES; or an object, a drafter's config.json `_name_or_path` -> kind of prompt
  (simulation.DEFAULT_ACCEPT's keys) -> factor > 0 on its acceptance beyond the bonus token, the kinds not
  given 1.0; it replaces the defaults, and a drafter not named, or with no `_name_or_path`, has none).

The server reads it at start-up; `refuse_flush_cache` is read again at each /flush_cache, so a
test can switch it while the server runs. Unknown keys or wrong types fail loudly: a typo in a
test must not silently run the default.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import simulation

FILE_NAME = "sglang-standin.json"
FAULTS = (
    *("crash_at_startup", "never_healthy", "refuse_flush_cache", "nccl_error", "nccl_hang", "wrong_tp"),
    "miscount_metrics",
)
#: the landscape's numeric switches (simulation.Physics)
LANDSCAPE_NUMBERS = ("tree_gain", "verify_cost_per_token", "batch_slowdown")


@dataclass(frozen=True)
class Switches:
    fault: str | None = None
    accept_length: float | None = None
    decode_tokens_per_s: float = 300.0
    startup_s: float = 1.5
    broken_drafter: bool = False
    stream_interval: int = 1
    modelled_clock: bool = False
    tree_gain: float = simulation.TREE_GAIN
    verify_cost_per_token: float = simulation.VERIFY_COST_PER_TOKEN
    batch_slowdown: float = simulation.BATCH_SLOWDOWN[True]
    drafter_profiles: dict[str, dict[str, float]] | None = None

    @property
    def physics(self) -> simulation.Physics:
        """The landscape these switches give (the module docstring's last item)."""
        profiles = simulation.DRAFTER_PROFILES if self.drafter_profiles is None else self.drafter_profiles
        return simulation.Physics(self.tree_gain, self.verify_cost_per_token, self.batch_slowdown, profiles)

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"fault {self.fault!r}: one of {', '.join(FAULTS)} or null")
        if self.accept_length is not None and not self.accept_length >= 1.0:
            raise ValueError(f"accept_length {self.accept_length!r}: >= 1.0 or null")
        if not self.decode_tokens_per_s > 0:
            raise ValueError(f"decode_tokens_per_s {self.decode_tokens_per_s!r}: > 0")
        if not self.startup_s >= 0:
            raise ValueError(f"startup_s {self.startup_s!r}: >= 0")
        if (
            isinstance(self.stream_interval, bool)
            or not isinstance(self.stream_interval, int)
            or self.stream_interval < 1
        ):
            raise ValueError(f"stream_interval {self.stream_interval!r}: an integer >= 1")
        for key in LANDSCAPE_NUMBERS:
            if not getattr(self, key) >= 0:
                raise ValueError(f"{key} {getattr(self, key)!r}: >= 0")


def path(home: str | os.PathLike[str] | None = None) -> Path:
    """Where the switches live: `$HOME/sglang-standin.json` of the host."""
    return Path(home if home is not None else os.path.expanduser("~")) / FILE_NAME


def parse(data: object) -> Switches:
    if not isinstance(data, dict):
        raise ValueError(f"{FILE_NAME} must hold a JSON object, not {type(data).__name__}")
    known = set(Switches.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{FILE_NAME}: unknown keys {unknown}; known: {sorted(known)}")
    for key in ("accept_length", "decode_tokens_per_s", "startup_s", *LANDSCAPE_NUMBERS):
        if key not in data or (data[key] is None and key == "accept_length"):
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{FILE_NAME}: {key} must be a number, not {value!r}")
    for key in ("broken_drafter", "modelled_clock"):
        if not isinstance(data.get(key, False), bool):
            raise ValueError(f"{FILE_NAME}: {key} must be true or false, not {data[key]!r}")
    if "fault" in data and data["fault"] is not None and not isinstance(data["fault"], str):
        raise ValueError(f"{FILE_NAME}: fault must be a string or null, not {data['fault']!r}")
    if data.get("drafter_profiles") is not None:
        _check_profiles(data["drafter_profiles"])
    values: dict[str, Any] = {
        key: float(v) if isinstance(v, int) and not isinstance(v, bool) and key != "stream_interval" else v
        for key, v in data.items()
    }
    return Switches(**values)


def _check_profiles(profiles: object) -> None:
    """`drafter_profiles`: an object of drafters, each an object of kinds of prompt and positive factors."""
    where = f"{FILE_NAME}: drafter_profiles"
    if not isinstance(profiles, dict):
        raise ValueError(f"{where} must be an object (drafter -> kind -> factor) or null, not {profiles!r}")
    for drafter, profile in profiles.items():
        if not isinstance(profile, dict):
            raise ValueError(f"{where}.{drafter} must be an object (kind -> factor), not {profile!r}")
        for kind, factor in profile.items():
            if kind not in simulation.DEFAULT_ACCEPT:
                raise ValueError(f"{where}.{drafter}: kind {kind!r} is none of {sorted(simulation.DEFAULT_ACCEPT)}")
            if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor > 0:
                raise ValueError(f"{where}.{drafter}.{kind} must be a number > 0, not {factor!r}")


def load(home: str | os.PathLike[str] | None = None) -> Switches:
    """The switches in force now (defaults when the file is absent)."""
    try:
        text = path(home).read_text()
    except FileNotFoundError:
        return Switches()
    return parse(json.loads(text))


class Switched:
    """Context manager for tests and the demo: the switches file written for the block, removed after.

    The switches are checked on the way in, so a typo fails in the test, not in the server.
    """

    def __init__(self, home: str | os.PathLike[str], switches: dict[str, Any]) -> None:
        parse(switches)
        self.path = path(home)
        self.switches = switches

    def __enter__(self) -> Path:
        self.path.write_text(json.dumps(self.switches))
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.path.unlink(missing_ok=True)
