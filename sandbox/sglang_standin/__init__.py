"""TEST DOUBLE of the SGLang server and of its serving benchmark client, for the test host only.

Real SGLang needs CUDA GPUs; this machine has none. On the test host (sandbox/testhost.py)
`python -m sglang.launch_server ...` and `python -m sglang.bench_serving ...` run these modules
instead of SGLang's, while every other look at the venv's `sglang` (the probe step's
importlib.metadata / find_spec / ast reads) still sees the real SGLang 0.5.23 files:

- hook.py: a meta-path finder that `python -m sandbox.prepare` activates through a `.pth` file in
  the test venv, only for an interpreter started with `-m sglang.launch_server` or
  `-m sglang.bench_serving`; it loads this package there as the top-level `sglang_standin`;
- server.py: the HTTP server (endpoints, JSON fields, log lines and start-up checks of 0.5.23);
- bench_client.py: the benchmark client (flags, summary and JSONL fields of 0.5.23);
- bench_datasets.py: its datasets read from a local file (speed-bench, custom, sharegpt), as 0.5.23's loaders;
- simulation.py: decode speed and acceptance length, deterministic per prompt;
- launch_args.py: the launch flags, read from the real release's own field declarations;
- launch.py: the checks SGLang makes of them and of the GPUs (nvidia-smi on PATH);
- faults.py: the fault switches, `$HOME/sglang-standin.json` on the host.

Everything here runs under the test venv's interpreter: stdlib only, relative imports only.
Never used by a real run.
"""
