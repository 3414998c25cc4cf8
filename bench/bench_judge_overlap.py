"""Judging overlapped with generation vs judging after the step's rollouts, on the embedded default.

A loopback OpenAI-compatible server answers every judge request after a fixed latency (default 200 ms), at
most `--concurrency` at a time, with deterministic verdicts (a hash of the trajectory and the rubric), read
from the request's own JSON schema. `rw train` runs the embedded default (rewardweaver, judge.kind=openai,
rewardweaver.admission=unvalidated: a hash cannot pass the acceptance test) twice from the same seed, with
judge.overlap=true and false, in this process one after the other. Reports the mean step time of each, their
ratio, and whether every metrics value apart from timings is identical.

    .venv/bin/python bench/bench_judge_overlap.py --steps 20 --out bench/results/judge-overlap
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


class JudgeServer:
    """Loopback chat-completions server: fixed latency, bounded concurrency, deterministic verdicts."""

    def __init__(self, latency: float, concurrency: int) -> None:
        self.latency = latency
        self.concurrency = concurrency
        self.slots = threading.Semaphore(concurrency)
        self.requests = 0
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # http.server naming
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                with owner.slots:
                    time.sleep(owner.latency)
                    content = owner.answer(body)
                with owner.lock:
                    owner.requests += 1
                data = json.dumps(
                    {
                        "id": "bench",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model", "m"),
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                        ],
                        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            request_queue_size = 1024  # the default backlog of 5 refuses connections under load (retries)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @staticmethod
    def answer(body: dict) -> str:
        """The judge's verdicts and the attributor's records from a hash of the request; any other role's
        answer the smallest instance of its schema."""
        form = body["response_format"]["json_schema"]
        schema, name = form["schema"], form["name"]
        request_id = schema["properties"]["request_id"]["enum"][0]
        # the request id is random per request: the verdict must not depend on it
        text = json.dumps(body["messages"][-1]["content"]).replace(request_id, "")

        def coin(key: str) -> bool:
            return bool(hashlib.sha256((text + key).encode()).digest()[0] % 2)

        if name == "rubric_verdicts":
            items = schema["properties"]["verdicts"]["items"]
            ids = [rid for v in items.get("anyOf", [items]) for rid in v["properties"]["rubric_id"]["enum"]]
            answer = {
                "request_id": request_id,
                "verdicts": [
                    {
                        "rubric_id": rid,
                        "verdict": "pass" if coin(rid) else "fail",
                        "score": None,
                        "confidence": 0.9,
                        "evidence": "turn 1",
                    }
                    for rid in dict.fromkeys(ids)
                ],
            }
            if "diagnostics" in schema["properties"]:
                answer["diagnostics"] = {"uncovered": []}
            return json.dumps(answer)
        if name == "failure_attribution":
            ids = list(schema["properties"]["records"]["properties"])
            return json.dumps(
                {
                    "request_id": request_id,
                    "records": {
                        cid: {"deficit": coin(cid), "confidence": 0.9, "evidence": "turn 1", "cause": "policy"}
                        for cid in ids
                    },
                }
            )
        return json.dumps(_smallest(schema))


def _smallest(schema: dict):
    """The smallest instance of a structured-output schema (enums' first value, minimal lists and strings)."""
    if "anyOf" in schema:
        return _smallest(schema["anyOf"][0])
    kind = schema.get("type")
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object":
        return {key: _smallest(value) for key, value in schema.get("properties", {}).items()}
    if kind == "array":
        return [_smallest(schema["items"]) for _ in range(schema.get("minItems", 0))]
    if kind == "string":
        return "x" * max(1, schema.get("minLength", 0))
    if kind == "number":
        return 0.5
    if kind == "boolean":
        return False
    return None


def run(server: JudgeServer, overlap: bool, steps: int, folder: Path) -> list[dict]:
    from rwcore.trainer.config import load_config
    from rwcore.trainer.trainer import Trainer

    overrides = [
        f"train.steps={steps}",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "judge.kind=openai",
        "judge.model=bench-judge",
        f"judge.base_url={server.base_url}",
        "judge.api_key_env=RWCORE_BENCH_NO_KEY",
        "rewardweaver.admission=unvalidated",
        f"judge.overlap={str(overlap).lower()}",
        f"judge.max_concurrency={server.concurrency}",
    ]
    trainer = Trainer(load_config(None, overrides), folder, quiet=True)
    trainer.setup()
    trainer.train()
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--out", default=None, help="folder for judge-overlap.json / .md (default: print only)")
    args = parser.parse_args(argv)
    import torch
    from _report import machine

    server = JudgeServer(args.latency, args.concurrency)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for overlap in (False, True):  # the same seed, one after the other in this process
            rows = run(server, overlap, args.steps, Path(tmp) / f"overlap-{overlap}")
            train = [r for r in rows if r["kind"] == "train"]
            results[overlap] = {
                "rows": rows,
                "step_s": [r["time/step"] for r in train],
                "judge_s": [r["time/judge"] for r in train],
                "judge_wait_s": [r["time/judge_wait"] for r in train],
            }
    timing = ("time/", "judge/seconds", "reflector/seconds")
    same = all(
        {k: v for k, v in a.items() if not k.startswith(timing)}
        == {k: v for k, v in b.items() if not k.startswith(timing)}
        for a, b in zip(results[False]["rows"], results[True]["rows"])
    ) and len(results[False]["rows"]) == len(results[True]["rows"])
    mean = {k: sum(v["step_s"]) / len(v["step_s"]) for k, v in results.items()}
    report = {
        "latency_s": args.latency,
        "concurrency": args.concurrency,
        "steps": args.steps,
        "step_s_without_overlap": mean[False],
        "step_s_with_overlap": mean[True],
        "speedup": mean[False] / mean[True],
        "judge_s_mean": {str(k): sum(v["judge_s"]) / len(v["judge_s"]) for k, v in results.items()},
        "judge_wait_s_mean": {str(k): sum(v["judge_wait_s"]) / len(v["judge_wait_s"]) for k, v in results.items()},
        "identical_metrics_apart_from_timings": same,
        "server_requests": server.requests,
        "machine": machine(),
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(report, indent=1))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "judge-overlap.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
