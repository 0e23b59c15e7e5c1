"""`benchmark`: SGLang's serving benchmark against a deployed server, `repeats` clean runs per
concurrency, and, given a baseline benchmark step, the comparison report of the run.

Each run (each concurrency, each repeat) is its own audited command on the host, with the step's
timeout: `$python -m sglang.benchmark.serving --backend sglang --base-url <deploy's base_url> --dataset-name
random-ids ... --seed S --flush-cache` (random-ids: token ids drawn locally, nothing to download on a host
without network), writing to a JSONL file in a fresh temporary folder that the script prints after a marker
line and removes (or, its bash killed outright, the next program on the host: `marked_folder`). The line
it appended becomes a typed `BenchRun` (steps/benchmark_results.py), with its repeat,
seed, entry point, command and times. The module is the one the host's SGLang has (steps/bench_entry.py): the
current `sglang.benchmark.serving`, else the deprecated `sglang.bench_serving` of older releases, chosen on the
host before each run and recorded as the run's `entry_point`.
bench_serving writes its line even when requests failed, so a run that completed
fewer requests than it sent fails the step, naming the concurrency and repeat, rather than reporting a
throughput of the requests that happened to succeed.

Every run is clean, so that a real server's radix cache and running averages flatter nothing:
- its own seed: `seed` + the run's number (0, 1, 2, ... over concurrency x repeat, in order). random-ids
  draws the same prompts for the same seed, so no two runs on one server share prompts (the cache would
  serve their prefixes), while a baseline and a candidate with the same concurrencies and repeats send
  the same prompts at each (concurrency, repeat);
- `--flush-cache` after bench_serving's warmup (which re-sends the run's first prompt and is not counted):
  the measured requests find an empty prefix cache, and the server's acceptance average restarts, so the
  run's `accept_length` (`/server_info`'s `avg_spec_accept_length`, read after the run) is that run's
  own, never a running average over the eval's requests or earlier runs. A refused flush (400) fails
  the run.
The repeats of a concurrency become a `BenchPoint`: the median, min-max and relative MAD of each metric,
`noisy` where the output throughput's relative MAD exceeds `spread_threshold` or its range twice that; speedups
are of medians.

With `compare_to: <baseline benchmark step>` (and optionally `acceptance: <eval_acceptance step>`)
the step writes report.json, report.md and its figures into the run folder (steps/benchmark_report.py),
with the provenance of the numbers gathered from the earlier steps' facts (steps/provenance.py), and
its facts carry the speedups, so a gate can say
`facts.speedup.min >= 1.0`. Both benchmarks must have used the same prompt lengths: a comparison of
unlike runs is refused before anything runs.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, NamedTuple

from pydantic import Field, ValidationError, field_validator, model_validator

from executor.hostprogram import marked_folder, program_files, program_run
from executor.render import host_word, pasted_word
from executor.runbook.model import Gate
from executor.runbook.search import Band, Measure
from executor.stepkind import (
    HUB_ENV,
    FactsError,
    Outcome,
    RenderContext,
    RunTime,
    StepContext,
    StepRef,
    StepSpec,
    VarRef,
    resolve_var,
)
from steps.bench_entry import ENTRY_POINTS, choose_lines, ran_entry_point
from steps.benchmark_results import JSONL_MARKER, BenchPoint, BenchRun, RunInfo, jsonl_lines, parse_run, points
from steps.benchmark_slo import Slo
from steps.benchmark_workloads import DEFAULT, Workload, WorkloadFacts, slice_key, unlike
from steps.request_records import RecordsFile, asks_details, bench_records

# The step's facts, the comparison report, its provenance and figures (~30 pydantic models) are imported by
# the methods that run the step: `runbook validate` and `plan` import every kind a runbook names and use
# none of them (bench/RESULTS.md, 9d).
if TYPE_CHECKING:
    from executor.transport.base import CommandResult
    from steps import provenance
    from steps.benchmark_report import Acceptance, BenchmarkFacts, Side

Positive = Annotated[int, Field(gt=0)]
SCRAPE_TIMEOUT_S = 30.0  # one GET of /metrics, its whole answer
#: the warm-up's output tokens at most, as the client's own warm-up asks (0.5.23 benchmark/serving.py:
#: `output_len=min(test_request.output_len, 32)`): it warms the server up, it measures nothing
WARMUP_OUTPUT_MAX = 32
#: The most runs one step may have (workloads and their categories x concurrencies x repeats), counted before any
#: list of them is made: each is its own command of ~30 kB (the /metrics scraper travels in it) that `plan` renders
#: and `run` audits, and a run takes minutes (the flagship's benchmark has 48).
MAX_RUNS = 1000


def _above_zero(text: str) -> int:
    if not text.strip().isdigit() or int(text) == 0:
        raise ValueError("expected a whole number above 0, such as 3")
    return int(text)


def band_of(workload: str, category: str | None, concurrency: int) -> Band:
    """How a campaign's search names a workload (and category) at a concurrency: `speed-bench/mixed c=4`."""
    return f"{slice_key(workload, category)} c={concurrency}"


class Slot(NamedTuple):
    """One run of the schedule: its workload's label and category (speed-bench's; else None), concurrency,
    repeat and seed."""

    workload: str
    category: str | None
    concurrency: int
    repeat: int
    seed: int


class Measuring(NamedTuple):
    """What every run of one benchmark step shares: its context, the server's URL, the facts its runs go into
    and the records file of their requests."""

    ctx: StepContext
    base_url: str
    facts: BenchmarkFacts
    records: RecordsFile


class BenchmarkStep(StepSpec):
    """Run bench_serving at each concurrency; with `compare_to`, report against that baseline."""

    kind: Literal["benchmark"] = "benchmark"
    literal_fields: ClassVar[frozenset[str]] = frozenset({"label"})  # the report's text
    #: huggingface_hub (and its `hf` CLI) read HF_ENDPOINT, HF_TOKEN, HF_HOME, HF_HUB_* from the environment
    kind_env: ClassVar[tuple[str, ...]] = HUB_ENV
    server: StepRef  # id of the deploy step: its facts.base_url is the server to measure
    python: str = "python3"  # the SGLang environment's interpreter; `~` and `$vars` expand on the host
    label: str | None = None  # the name in the report (default: the step's id)
    concurrencies: list[Positive] = Field(default=[1, 4, 16], min_length=1)  # bench_serving's --max-concurrency, each
    workloads: list[Workload] | None = Field(default=None, min_length=1)  # None: random ids alone, unlabelled
    input_len: Positive = 1024  # tokens of each random prompt
    output_len: Positive = 512  # tokens asked of each answer
    num_prompts: Positive | None = None  # per concurrency; default 4 x concurrency, at least 8
    warmup_requests: Annotated[int, Field(ge=0)] = 1  # sent before each measured run, not counted
    repeats: Positive | VarRef = 3  # clean runs per concurrency, or a var ($bench_repeats: one for a quick look)
    seed: Annotated[int, Field(ge=0)] = 1  # the first run's --seed; each later run's is one more
    spread_threshold: Annotated[float, Field(ge=0)] = 0.05  # noisy above this rel MAD (or twice it in range)
    extra_args: list[str] = []  # passed to bench_serving (["--tokenizer", "$models/x"]: `$vars` expand on the host)
    compare_to: StepRef | None = None  # id of the baseline benchmark step
    acceptance: StepRef | None = None  # id of an eval_acceptance step, for the report's acceptance table
    slo: Slo | None = None  # latency SLOs: each measured run's goodput against them (the client's --goodput)

    @field_validator("concurrencies")
    @classmethod
    def _distinct(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"each concurrency may appear once, got {value}")
        return value

    @model_validator(mode="after")
    def _references(self) -> BenchmarkStep:
        if self.compare_to == self.id:
            raise ValueError("compare_to names this step itself; name the baseline benchmark step")
        if self.acceptance and not self.compare_to:
            raise ValueError("acceptance goes into the comparison report: it needs compare_to (the baseline)")
        labels = [w.label for w in self.workloads or []]
        if len(set(labels)) != len(labels):
            raise ValueError(f"workloads: each label may appear once, got {labels}")
        if isinstance(self.repeats, int):  # a var's value is checked when the step is resolved (`at_site`)
            self._check_runs(self.repeats)
        return self

    def _check_runs(self, repeats: int) -> int:
        """`repeats`, when the runs it makes are within MAX_RUNS and their seeds within numpy's; else ValueError."""
        runs = sum(len(w.slices()) for w in self.effective_workloads) * len(self.concurrencies) * repeats
        if runs > MAX_RUNS:
            raise ValueError(
                f"{runs:,} runs (workloads and their categories x concurrencies x repeats): at most {MAX_RUNS:,}, "
                "each its own command"
            )
        last = self.seed + runs - 1
        if last >= 2**32:
            raise ValueError(f"the last run's seed would be {last}: bench_serving's seeds (numpy's) are below 2**32")
        return repeats

    def at_site(self, ctx: RenderContext) -> BenchmarkStep:
        """This step with `repeats` given as a var (`$bench_repeats`) replaced by the var's value on ctx's host, a
        whole number above 0 whose runs fit MAX_RUNS: a site (or `--var bench_repeats=1`, a quick look) sets it. A
        value that does not fit fails the step naming the var, at `validate` and before the run starts."""
        if isinstance(self.repeats, int):
            return self
        repeats = resolve_var(ctx, self.repeats, "repeats", lambda text: self._check_runs(_above_zero(text)))
        return self.model_copy(update={"repeats": repeats})

    @property
    def repeat_count(self) -> int:
        """`repeats` of a step `at_site` made (a var left unresolved is a bug of the caller, never a host's)."""
        if not isinstance(self.repeats, int):
            raise FactsError(f"repeats {self.repeats} used before the step was resolved at its site")
        return self.repeats

    def check_runbook(self, steps: Mapping[str, StepSpec]) -> list[str]:
        """A comparison of unlike workloads, refused at `validate`: the baseline's and this step's workloads as
        they will run (the chat template decided by whether each server's deploy step speculates)."""
        baseline = steps.get(self.compare_to or "")
        if not isinstance(baseline, BenchmarkStep):
            return []
        base_spec, own_spec = _speculates(steps, baseline.server), _speculates(steps, self.server)
        why = unlike(
            [w.as_run(base_spec) for w in baseline.effective_workloads],
            [w.as_run(own_spec) for w in self.effective_workloads],
        )
        return [] if why is None else [f"compare_to {self.compare_to!r} runs other prompts: {why}: not comparable"]

    @property
    def shown_label(self) -> str:
        return self.label or self.id

    def prompts_at(self, concurrency: int) -> int:
        return self.num_prompts or max(8, 4 * concurrency)

    @property
    def effective_workloads(self) -> list[Workload]:
        return self.workloads or [DEFAULT]

    def resolved_workloads(self, speculative: bool) -> list[WorkloadFacts]:
        """The workloads as they run against a server that speculates or not (steps/benchmark_workloads.py)."""
        return [w.resolved(speculative) for w in self.effective_workloads]

    def schedule(self) -> list[Slot]:
        """Each run, in the order they run: per workload (and speed-bench category), per concurrency, the
        repeats. Seeds count up over all of them, so no two runs on one server share prompts."""
        order = [
            (w.label, category, c, r)
            for w in self.effective_workloads
            for category in w.slices()
            for c in self.concurrencies
            for r in range(1, self.repeat_count + 1)
        ]
        return [Slot(*slot, self.seed + number) for number, slot in enumerate(order)]

    def run_name(self, concurrency: int, repeat: int, workload: str | None = None, category: str | None = None) -> str:
        """How messages and progress name a run: "concurrency 4, repeat 2/3" (the repeat only when several),
        after "speed-bench/low_entropy, " when the step names its workloads."""
        name = f"concurrency {concurrency}" + (f", repeat {repeat}/{self.repeats}" if self.repeat_count > 1 else "")
        return f"{slice_key(workload, category)}, {name}" if self.workloads and workload else name

    def default_gates(self) -> list[Gate]:
        return [Gate(that="facts.failure is none", message="the benchmark did not complete")]

    def search_measures(self, facts: Any) -> dict[Band, Measure]:
        """One band per workload (and SPEED-Bench category) and concurrency (`speed-bench/mixed c=4`): output
        throughput's median and range over the repeats, and the acceptance length the server reported. Facts
        that do not read as a benchmark's (a failed run, a tampered record) measure nothing."""
        from steps.benchmark_report import BenchmarkFacts

        try:
            return self.measures_of(BenchmarkFacts.model_validate(facts).points)
        except ValidationError:
            return {}

    @staticmethod
    def measures_of(points: list[BenchPoint]) -> dict[Band, Measure]:
        """Each point's band and its output throughput and acceptance, as the search reads them."""
        found = {}
        for point in points:
            throughput = point.output_throughput
            if throughput is None:
                continue
            accept = None if point.accept_length is None else float(point.accept_length.median)
            band = band_of(point.workload, point.category, point.max_concurrency)
            found[band] = Measure(float(throughput.median), float(throughput.min), float(throughput.max), accept)
        return found

    # ---- scripts ---------------------------------------------------------------------------------------

    def command(
        self,
        base_url: str,
        concurrency: int,
        seed: int,
        pasted: Mapping[str, str] | None = None,
        out: str = '"$out/bench.jsonl"',
        workload: WorkloadFacts | None = None,
        category: str | None = None,
        module: str = '"$entry"',
        warmup: bool = False,
    ) -> str:
        """The serving benchmark's command line of one run: the script's, as rendered (`python`, a workload's `path`
        and `extra_args` are host words: `~` and `$vars` expand there, as in deploy's; `module` the entry point
        chosen on the host); with `pasted` (the host's vars), `out` and `module`, as a person would paste it.
        Without `workload`: random ids. `warmup`: the run's warm-up requests as a run of their own, before the
        window of its exact acceptance (`metered`); the measured run then sends none."""

        def word(text: str) -> str:
            return host_word(text) if pasted is None else pasted_word(text, pasted)

        workload = workload or DEFAULT.resolved(False)
        args: list[str | int] = ["--backend", workload.backend, "--base-url", base_url]
        output_len = min(self.output_len, WARMUP_OUTPUT_MAX) if warmup else self.output_len
        args += workload.client_args(category, self.input_len, output_len)
        if workload.dataset == "random-ids":
            args += ["--random-range-ratio", "1.0"]
        prompts = self.warmup_requests if warmup else self.prompts_at(concurrency)
        args += ["--num-prompts", prompts]
        args += ["--max-concurrency", concurrency, "--warmup-requests", 0, "--disable-tqdm"]
        args += ["--seed", seed, *([] if warmup else ["--flush-cache"])]
        # per-request details, kept as JSONL in the run folder (steps/request_records.py), where they fit
        args += ["--output-details"] if not warmup and asks_details(prompts, self.output_len) else []
        args += self.slo.goodput_args() if self.slo and not warmup else []
        words = " ".join([*(shlex.quote(str(arg)) for arg in args), *(word(arg) for arg in self.extra_args)])
        dataset = f" --dataset-path {word(workload.path)}" if workload.path else ""
        return f"{word(self.python)} -m {module} {words}{dataset} --output-file {out}"

    def script(
        self,
        base_url: str,
        concurrency: int,
        repeat: int,
        seed: int,
        workload: WorkloadFacts | None = None,
        category: str | None = None,
    ) -> str:
        what = (
            f"{self.input_len} input / {self.output_len} output tokens (random-ids: nothing to download)"
            if workload is None or workload.dataset == "random-ids"
            else f"{workload.dataset} from its file, {self.output_len} output tokens, chat template "
            + workload.template_shown()
        )
        return (
            f"# bench_serving at {self.run_name(concurrency, repeat, workload.label if workload else None, category)}: "
            f"{self.prompts_at(concurrency)} prompts of {what}, seed {seed}, the cache flushed after the warmup\n"
            + marked_folder("out")
            + choose_lines(host_word(self.python))
            + self.metered(base_url, concurrency, seed, workload, category)
            + f"echo {shlex.quote(JSONL_MARKER)}\n"
            'cat "$out/bench.jsonl" 2> /dev/null\n'  # none when bench_serving failed first
            'exit "$rc"\n'
        )

    def speculative(self, ctx: RenderContext) -> bool:
        """Whether the server speculates: its deploy step's fact `speculative_algorithm` (a server of another
        kind of step, without that fact, does not). A plan, which cannot know, shows a server that does not,
        and its summary says the rule."""
        try:
            value = ctx.fact(self.server, "speculative_algorithm")
        except (KeyError, IndexError, TypeError):
            return False
        return not isinstance(value, RunTime) and value is not None

    def slots(self, ctx: RenderContext) -> list[tuple[Slot, WorkloadFacts]]:
        """Each run of the schedule with its workload as it runs against this step's server."""
        resolved = {w.label: w for w in self.resolved_workloads(self.speculative(ctx))}
        return [(slot, resolved[slot.workload]) for slot in self.schedule()]

    def metered(
        self, base_url: str, concurrency: int, seed: int, workload: WorkloadFacts | None, category: str | None
    ) -> str:
        """Bash lines of one run inside its exact-acceptance window (steps/server_metrics.py), `rc` its status.
        bench_serving (0.5.23 benchmark/serving.py `benchmark`) sends its warm-up requests, then flushes the cache,
        then runs: its warm-up would fall inside any window around it, and nothing outside it can tell those
        tokens apart. So the warm-up runs first as a client run of its own (`--num-prompts` the warm-up count),
        then /metrics is scraped, the measured run sends no warm-up (`--warmup-requests 0`; `--flush-cache` still
        flushes before it), and /metrics is scraped again. The scrapes come back after METRICS_MARKER."""
        from steps.server_metrics import FAMILIES, METRICS_MARKER

        config = {"base_url": base_url, "families": list(FAMILIES), "timeout_s": SCRAPE_TIMEOUT_S}
        scrape = program_run(self.python, "out").rstrip("\n")  # shipped once into the run's folder, run twice
        warm_out = '"$out/warmup.jsonl"'
        warm = self.command(base_url, concurrency, seed, None, warm_out, workload, category, warmup=True)
        return (
            (f"{warm} || exit\n" if self.warmup_requests else "")
            + program_files("scrape_metrics", config, "out")
            + f'{scrape} > "$out/metrics.before"\n'
            + f"{self.command(base_url, concurrency, seed, workload=workload, category=category)}\nrc=$?\n"
            + f'if [ "$rc" = 0 ]; then\n{scrape} > "$out/metrics.after"\n'
            + f'echo {shlex.quote(METRICS_MARKER)}\ncat "$out/metrics.before" "$out/metrics.after"\nfi\n'
        )

    def plan(self, ctx: RenderContext) -> list[tuple[str, str]]:
        step, base_url = self.at_site(ctx), str(ctx.fact(self.server, "base_url"))
        return [
            (
                step.run_name(s.concurrency, s.repeat, s.workload, s.category),
                step.script(base_url, s.concurrency, s.repeat, s.seed, w, s.category),
            )
            for s, w in step.slots(ctx)
        ]

    def summary(self, ctx: RenderContext) -> list[str]:
        if (step := self.at_site(ctx)) is not self:
            return step.summary(ctx)
        runs = len(self.schedule())
        what = f"{self.input_len} in / {self.output_len} out tokens"
        if self.workloads:
            shown = [f"{w.label} ({w.dataset}, chat template {w.template_shown()})" for _, w in self.slots(ctx)]
            what = f"workloads {', '.join(dict.fromkeys(shown))}, {self.output_len} out tokens"
            if any(w.dataset in ("custom", "sharegpt") and w.chat_template is None for w in self.workloads):
                what += f" (custom, sharegpt: chat template on if steps.{self.server}.facts.speculative_algorithm)"
        return [
            f"{_entry_rule()} against {self.server}: concurrency {', '.join(map(str, self.concurrencies))} x "
            f"{self.repeats} repeat{'s' if self.repeat_count > 1 else ''}, {what}; {self._warmup_shown()}; "
            f"run 1 of {runs} (each has its own seed)"
            + (f"; goodput against {self.slo.shown()}" if self.slo else "")
            + ":"
        ]

    def _warmup_shown(self) -> str:
        """The uncounted warm-up, which the plan's one command does not show: a client run of its own."""
        if not self.warmup_requests:
            return "no warm-up"
        return f"each after a warm-up run of {self.warmup_requests} request(s), outside its /metrics window"

    def commands(self, ctx: RenderContext) -> list[str]:
        slot, workload = self.at_site(ctx).slots(ctx)[0]
        base_url = str(ctx.fact(self.server, "base_url"))
        at, newest = (slot.concurrency, slot.seed), ENTRY_POINTS[0][0]
        return [self.command(base_url, *at, ctx.vars, "bench.jsonl", workload, slot.category, newest)]

    # ---- running ---------------------------------------------------------------------------------------

    def read_run(self, result: CommandResult, info: RunInfo) -> tuple[BenchRun | None, str | None]:
        """The run of one command, or why it does not count."""
        where = self.run_name(info.max_concurrency, info.repeat, info.workload, info.category)
        lines = jsonl_lines(result.stdout_text)
        if result.exit_code != 0:
            said = error_line(result.stdout_text.partition(JSONL_MARKER)[0], result.stderr_text)
            return None, f"{where}: {info.entry_point or 'the serving benchmark'} {_exited(result)}: {said}"
        if not lines:
            return None, f"{where}: bench_serving exited 0 but wrote no JSONL line"
        try:
            run = parse_run(lines[-1], info)
        except ValueError as exc:
            return None, f"{where}: {exc}"
        run = with_exact_acceptance(run, result.stdout_text.partition(JSONL_MARKER)[0])
        shortfall = run.shortfall
        return run, f"{where}: {shortfall}" if shortfall else None

    async def execute(self, ctx: StepContext) -> Outcome:
        from steps.benchmark_figures import write_report
        from steps.benchmark_report import BenchmarkFacts, Side, speedup

        if (step := self.at_site(ctx)) is not self:
            return await step.execute(ctx)
        base_url = str(_fact(ctx, self.server, "base_url", "server"))
        slots = self.slots(ctx)
        workloads = list({workload.label: workload for _, workload in slots}.values())
        baseline = self._baseline(ctx, workloads)
        acceptance = self._acceptance(ctx)
        facts = BenchmarkFacts(
            label=self.shown_label,
            server=self.server,
            base_url=base_url,
            input_len=self.input_len,
            output_len=self.output_len,
            workloads=workloads,
            concurrencies=list(self.concurrencies),
            repeats=self.repeat_count,
            spread_threshold=self.spread_threshold,
            runs=[],
            points=[],
            failure=None,
            compare_to=self.compare_to,
            speedup=None,
            report=None,
        )
        records = RecordsFile(ctx.output_dir, self.id, ctx.redactor)
        facts.requests_file = records.relative_to(ctx.run_dir)
        result, stopped = await self._measure(Measuring(ctx, base_url, facts, records), slots)
        if stopped is not None:
            return stopped
        facts.points = points(facts.runs, self.spread_threshold)
        if baseline is not None:
            candidate = Side(
                step=self.id,
                label=self.shown_label,
                input_len=self.input_len,
                output_len=self.output_len,
                workloads=workloads,
                runs=facts.runs,
                points=facts.points,
            )
            origin = self._provenance(ctx, baseline, candidate, acceptance, facts.requests_file)
            _, files = write_report(ctx.run_dir, baseline, candidate, origin, acceptance, redactor=ctx.redactor)
            facts = facts.model_copy(update={"speedup": speedup(baseline, candidate), "report": files})
            ctx.progress(f"report written: {files.markdown_file}")
        return Outcome(result, facts)

    def keep_records(self, records: RecordsFile, ctx: StepContext, result: CommandResult, run: BenchRun) -> None:
        """The run's per-request details (`--output-details`) appended to the step's records file."""
        about: dict[str, Any] = {"run": ctx.run_dir.name, "host": ctx.host_name, "step": self.id}
        about |= {"label": self.shown_label}
        about |= {"workload": run.workload, "category": run.category}
        about |= {"concurrency": run.max_concurrency, "repeat": run.repeat, "seed": run.seed}
        lines = jsonl_lines(result.stdout_text) or [""]
        records.append(bench_records(lines[-1], about) or [])

    async def _measure(
        self, on: Measuring, slots: list[tuple[Slot, WorkloadFacts]]
    ) -> tuple[CommandResult, Outcome | None]:
        """Every run in order; for a configuration a campaign's search launched (`StepContext.screen`), first one
        repeat of each band (the screen), then the other repeats only where the search says it still contends: a
        loser is not measured in full (`facts.screened` names the bands left at one repeat)."""
        screen = on.ctx.screen()
        first = [s for s in slots if s[0].repeat == 1]
        if screen is None or len(first) == len(slots):
            return await self._run_all(on, slots)
        result, stopped = await self._run_all(on, first)
        if stopped is not None:
            return result, stopped
        keep = screen(self.measures_of(points(on.facts.runs, self.spread_threshold)))
        rest = [s for s in slots if s[0].repeat > 1 and self.band(s[0]) in keep]
        on.facts.screened = sorted({self.band(slot) for slot, _ in first} - keep)
        on.ctx.progress(f"screened: {len(keep)} of {len(first)} bands still contend, measured in full with the repeats")
        if not rest:
            return result, None
        return await self._run_all(on, rest, start=len(first))

    @staticmethod
    def band(slot: Slot) -> Band:
        return band_of(slot.workload, slot.category, slot.concurrency)

    async def _run_all(
        self, on: Measuring, slots: list[tuple[Slot, WorkloadFacts]], start: int = 0
    ) -> tuple[CommandResult, Outcome | None]:
        """Each run in turn, its `BenchRun` appended to `facts.runs`; the last result, and the outcome of a run
        that stopped the step (timed out, interrupted, failed: then with the points of the runs before it).
        `start`: runs done before these (a screen's), for the progress count."""
        ctx, facts = on.ctx, on.facts
        result: CommandResult | None = None
        total = start + len(slots)
        for done, (slot, workload) in enumerate(slots, start):
            concurrency, repeat, seed = slot.concurrency, slot.repeat, slot.seed
            name = self.run_name(concurrency, repeat, slot.workload, slot.category)
            fields = {"concurrency": concurrency, "repeat": repeat, "workload": slice_key(slot.workload, slot.category)}
            ctx.progress(
                f"{name} ({done + 1}/{total}): {self.prompts_at(concurrency)} prompts, seed {seed}",
                **fields,
                seed=seed,
                done=done,
                total=total,
            )
            result = await ctx.run(self.script(on.base_url, concurrency, repeat, seed, workload, slot.category))
            if result.timed_out or result.interrupted:
                return result, Outcome(result)
            run, failure = self.read_run(result, self.run_info(result, on.base_url, slot, workload))
            if failure:  # the runs that completed before it, summed up as far as they go
                summed = points(facts.runs, self.spread_threshold)
                return result, Outcome(result, facts.model_copy(update={"failure": failure, "points": summed}))
            assert run is not None
            facts.runs.append(run)
            self.keep_records(on.records, ctx, result, run)
            ctx.progress(f"{name}: {run.output_throughput or 0:.1f} output tok/s", **fields, done=done + 1, total=total)
        assert result is not None  # concurrencies has at least one entry
        return result, None

    def run_info(
        self, result: CommandResult, base_url: str, slot: Slot, workload: WorkloadFacts | None = None
    ) -> RunInfo:
        """What the run was asked, and when the controller saw its command start and end."""
        started = datetime.fromisoformat(result.started_at)
        finished = (started + timedelta(seconds=result.duration_s)).isoformat(timespec="milliseconds")
        entry = ran_entry_point(result.stdout_text.partition(JSONL_MARKER)[0])
        return RunInfo(
            workload=slot.workload,
            category=slot.category,
            max_concurrency=slot.concurrency,
            num_prompts=self.prompts_at(slot.concurrency),
            repeat=slot.repeat,
            seed=slot.seed,
            started_at=result.started_at,
            finished_at=finished,
            entry_point=entry,
            slo_ms=self.slo.client_slos() if self.slo else None,
            command=self.command(
                base_url,
                slot.concurrency,
                slot.seed,
                workload=workload,
                category=slot.category,
                module=entry or '"$entry"',
            ),
        )

    def _baseline(self, ctx: StepContext, workloads: list[WorkloadFacts]) -> Side | None:
        """The baseline's side of the comparison; a FactsError, before anything runs, when it ran other prompts."""
        from steps.benchmark_report import Side

        if self.compare_to is None:
            return None
        step = self.compare_to
        keys = ("label", "input_len", "output_len", "runs", "points")
        facts = {key: _fact(ctx, step, key, "compare_to") for key in keys}
        if _fact(ctx, step, "failure", "compare_to") is not None:
            raise FactsError(f"compare_to: the baseline benchmark {step!r} did not complete")
        try:  # a baseline's facts from before workloads: random ids
            facts["workloads"] = ctx.fact(step, "workloads")
        except (KeyError, IndexError, TypeError):
            facts["workloads"] = [DEFAULT.resolved(False)]
        try:
            side = Side(step=step, **facts)
        except ValidationError as exc:
            raise FactsError(f"compare_to: step {step!r} has no benchmark facts: {exc}") from None
        if (why := unlike(list(map(asdict, side.workloads)), list(map(asdict, workloads)))) is not None:
            raise FactsError(f"compare_to: the baseline {step!r} ran other prompts: {why}: not comparable")
        random_ids = any(w.dataset == "random-ids" for w in workloads)
        if (side.input_len if random_ids else 0, side.output_len) != (
            self.input_len if random_ids else 0,
            self.output_len,
        ):
            raise FactsError(
                f"compare_to: the baseline {step!r} ran {side.input_len} input / {side.output_len} output tokens, "
                f"this step {self.input_len} / {self.output_len}: the throughputs would not be comparable"
            )
        return side

    def _acceptance(self, ctx: StepContext) -> Acceptance | None:
        from steps.benchmark_report import Acceptance

        if self.acceptance is None:
            return None
        sets = _fact(ctx, self.acceptance, "sets", "acceptance")
        facts = ctx.facts_of_kind("eval_acceptance").get(self.acceptance) or {"sets": sets}
        try:
            return Acceptance.model_validate({**facts, "step": self.acceptance})
        except ValidationError as exc:
            raise FactsError(
                f"acceptance: the sets of step {self.acceptance!r} are not acceptance facts: {exc}"
            ) from None

    def _provenance(
        self,
        ctx: StepContext,
        baseline: Side,
        candidate: Side,
        acceptance: Acceptance | None,
        requests_file: str | None = None,
    ) -> provenance.Provenance:
        """What the report's numbers are of, from the facts of the steps before this one on the host."""
        from steps import provenance

        baseline_server = str(_fact(ctx, baseline.step, "server", "compare_to"))
        baseline_file = ctx.facts_of_kind("benchmark").get(baseline.step, {}).get("requests_file")
        sides = [
            provenance.Measured(baseline.label, baseline.step, baseline_server, baseline.runs, baseline_file),
            provenance.Measured(candidate.label, candidate.step, self.server, candidate.runs, requests_file),
        ]
        return provenance.build(
            provenance.Sources.of(ctx),
            sides,
            generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
            acceptance_step=self.acceptance,
            acceptance_facts=None if acceptance is None else acceptance.model_dump(),
        )


def with_exact_acceptance(run: BenchRun, stdout: str) -> BenchRun:
    """`run` with its acceptance lengths: the exact one from the scrapes `metered` printed, beside the client's
    running average (`accept_length`, from /server_info)."""
    from steps.server_metrics import run_acceptance, scrapes

    before, after = scrapes(stdout)
    return run.model_copy(update={"acceptance": run_acceptance(before, after, run.accept_length)})


_WARNING = re.compile(r":\d+: \w*Warning: ")


def error_line(stdout: str, stderr: str) -> str:
    """The line that says why bench_serving failed: the last of stderr that is no Python warning
    (a traceback's exception), else the last of stdout ("Server at ... is not ready. Exiting.")."""
    lines, skip = [], False
    for line in filter(None, map(str.strip, stderr.splitlines())):
        if _WARNING.search(line):
            skip = True  # a warning is two lines: "file:line: XWarning: text" and the source line
        elif skip:
            skip = False
        else:
            lines.append(line)
    lines = lines or [line for line in map(str.strip, stdout.splitlines()) if line]
    return lines[-1][:300] if lines else "(no output)"


def _speculates(steps: Mapping[str, StepSpec], server: str) -> bool:
    """Whether the step that starts `server` will speculate, as far as the runbook says (a deploy step's
    algorithm; another kind of step: not, as its facts will say at run time)."""
    return getattr(steps.get(server), "algorithm", None) is not None


def _fact(ctx: StepContext, step: str, path: str, param: str) -> Any:
    """A fact of an earlier step, or a FactsError naming the parameter that pointed at it."""
    try:
        return ctx.fact(step, path)
    except (KeyError, IndexError, TypeError):
        raise FactsError(
            f"{param}: step {step!r} has no fact {path!r} on host {ctx.host_name} "
            "(does it run before this step, on the same host?)"
        ) from None


def _exited(result: CommandResult) -> str:
    """`exited 1`, or how a command without an exit code ended (`timed out`, `no exit status`): never `exited None`."""
    return f"exited {result.exit_code}" if result.exit_code is not None else result.ended


def _entry_rule() -> str:
    """Which client a run uses, chosen on the host before each run: the plan's command shows only the newest."""
    (newest, _), (old, _) = ENTRY_POINTS
    return f"{newest} (where the host's SGLang lacks it: the deprecated {old}, chosen on the host)"
