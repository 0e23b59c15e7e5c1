"""A TEST DOUBLE of one rank of a node group, for hostprograms/deploy.py's launch and watch: prints log lines,
serves /health (503 until a file exists, then 200) and /generate (SGLang's `text` field) when given a
port, and exits with a status when told. Files let the test decide when each thing happens, not time.

    fake_rank.py [--port P --ready FILE] [--worker] [--say LINE]... [--when FILE [--then LINE]...] [--exit CODE]

With --worker, first starts a worker (a process of its group, as a server's schedulers are, which outlives
it until TERM) and prints `worker PID`. Prints the --say lines, then (with --when) waits for FILE and prints
the --then lines, then exits with CODE if given, else serves (or sleeps) until stopped.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import subprocess
import sys
import threading
import time


class Handler(http.server.BaseHTTPRequestHandler):
    ready_file = ""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def answer(self, code: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        ready = os.path.exists(self.ready_file)
        self.answer(200 if ready else 503, {} if ready else {"error": "not ready"})

    def do_POST(self) -> None:
        self.answer(200, {"text": " Paris", "meta_info": {"completion_tokens": 1}})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int)
    parser.add_argument("--ready", default="")
    parser.add_argument("--say", action="append", default=[])
    parser.add_argument("--when")
    parser.add_argument("--then", action="append", default=[])
    parser.add_argument("--exit", type=int)
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print(f"worker {worker.pid}", flush=True)
    for line in args.say:  # before the port answers: a look that finds it answering finds these lines too
        print(line, flush=True)
    if args.port is not None:
        Handler.ready_file = args.ready
        server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    if args.when:
        while not os.path.exists(args.when):
            time.sleep(0.05)
        for line in args.then:
            print(line, flush=True)
    if args.exit is not None:
        return int(args.exit)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    sys.exit(main())
