#!/usr/bin/env python3
"""Replays a Mooncake trace through NVIDIA Dynamo's own KV router and mocker engines, offline.

    "$(scripts/tools/dynamo.sh)" bench/dynamo-replay.py TRACE [--router-mode kv_router] [--speedup 4] ...

The reference against which kvroute-sim's `dynamo` policy (a re-implementation of Dynamo's cost formula)
is compared: `dynamo.replay.run_trace_replay` of ai-dynamo 1.6.1 runs the real router (its radix indexer
fed by the mock engines' KV events, its own tracking of in-flight prefill tokens and decode blocks) in
front of N mock vLLM engines (AISimulate 0.13.0: chunked prefill, LRU prefix cache, polynomial step
timing) in simulated time, so a one-hour trace takes seconds. TRACE is Mooncake JSONL, one request a line:
`timestamp` (ms), `input_length`, `output_length` and `hash_ids` (one id per --trace-block-size tokens).

Prints one JSON object: the prefix-cache reuse ratio, TTFT (arrival to first token, queueing included),
TPOT and end-to-end latency in seconds, request and token counts, requests per worker, readmissions after
preemption, simulated duration and wall time, and the settings. `first_admission_prefix_cache_reused_ratio`
counts each request's cache hit once; `prefix_cache_reused_ratio` also counts re-admissions after a
preemption, so under overload it overstates reuse. The router breaks ties between equal-cost workers
at random with no seed, so kv_router runs vary slightly from run to run.
The standard library and the dynamo package only.
"""
import argparse
import json
import os
import sys
import time

# The router logs each decision at INFO: keep Dynamo's Rust logging quiet unless asked otherwise.
os.environ.setdefault("DYN_LOG", "warn")

from dynamo._core import KvRouterConfig  # noqa: E402
from dynamo.replay import run_trace_replay  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("trace", help="Mooncake JSONL trace")
    p.add_argument("--workers", type=int, default=8, help="mock engines (default 8)")
    p.add_argument("--router-mode", choices=["kv_router", "round_robin"], default="kv_router")
    p.add_argument("--speedup", type=float, default=1.0, help="arrival speedup ratio (default 1: the trace's rate)")
    p.add_argument("--trace-block-size", type=int, default=512, help="tokens per trace hash id (default 512)")
    engine = p.add_argument_group("mock engine (vLLM backend)")
    engine.add_argument("--block-size", type=int, default=16, help="KV block size in tokens (default 16)")
    engine.add_argument("--num-gpu-blocks", type=int, default=28610, help="KV blocks per engine (default 28610)")
    engine.add_argument("--max-num-batched-tokens", type=int, help="tokens per step (mocker default 8192)")
    engine.add_argument("--max-num-seqs", type=int, help="running requests per engine (mocker default 256)")
    router = p.add_argument_group("KV router (KvRouterConfig; defaults are Dynamo's)")
    router.add_argument("--overlap-score-weight", type=float,
                        help="deprecated alias of --prefill-load-scale; 0 also sets --overlap-score-credit 0")
    router.add_argument("--prefill-load-scale", type=float, default=1.0,
                        help="weight of the prompt-side (prefill) blocks in the cost (default 1)")
    router.add_argument("--overlap-score-credit", type=float, default=1.0,
                        help="credit per cached prefix block on the worker (default 1)")
    router.add_argument("--overlap-score-credit-decay", type=float, default=0.0,
                        help="shrinks the cache credit of workers with prefill backlog (default 0: off)")
    router.add_argument("--decode-active-request-weight", type=float, default=0.0,
                        help="blocks added to the cost per active request (default 0)")
    router.add_argument("--router-temperature", type=float, default=0.0,
                        help="softmax sampling over normalized costs; 0 picks the cheapest (default 0)")
    router.add_argument("--no-kv-events", action="store_true",
                        help="approximate mode: the index is built from the router's own decisions (TTL)")
    router.add_argument("--router-ttl-secs", type=float, default=120.0, help="approximate mode's TTL (default 120)")
    router.add_argument("--no-track-active-blocks", action="store_true",
                        help="do not count in-flight requests' blocks as decode load")
    router.add_argument("--no-track-prefill-tokens", action="store_true",
                        help="do not count in-flight requests' prompt tokens as prefill load")
    router.add_argument("--router-queue-threshold", type=float,
                        help="queue requests in the router while every worker's prefill load is above this "
                             "fraction of max_num_batched_tokens (default: no queue)")
    router.add_argument("--kv-event-lag-ms", type=float, help="delay of the KV events the indexer sees (default 0)")
    p.add_argument("--summary", action="store_true", help="include Dynamo's whole summary under \"summary\"")
    return p.parse_args()


def main():
    a = parse_args()
    engine = {"block_size": a.block_size, "num_gpu_blocks": a.num_gpu_blocks}
    if a.max_num_batched_tokens is not None:
        engine["max_num_batched_tokens"] = a.max_num_batched_tokens
    if a.max_num_seqs is not None:
        engine["max_num_seqs"] = a.max_num_seqs
    router = dict(
        prefill_load_scale=a.prefill_load_scale,
        overlap_score_credit=a.overlap_score_credit,
        overlap_score_credit_decay=a.overlap_score_credit_decay,
        decode_active_request_weight=a.decode_active_request_weight,
        router_temperature=a.router_temperature,
        use_kv_events=not a.no_kv_events,
        router_ttl_secs=a.router_ttl_secs,
        router_track_active_blocks=not a.no_track_active_blocks,
        router_track_prefill_tokens=not a.no_track_prefill_tokens,
        router_queue_threshold=a.router_queue_threshold,
    )
    if a.overlap_score_weight is not None:
        router["overlap_score_weight"] = a.overlap_score_weight
    kv = a.router_mode == "kv_router"
    started = time.monotonic()
    report = run_trace_replay(
        [a.trace],
        num_workers=a.workers,
        router_mode=a.router_mode,
        router_config=KvRouterConfig(**router) if kv else None,
        arrival_speedup_ratio=a.speedup,
        trace_block_size=a.trace_block_size,
        replay_mode="offline",
        extra_engine_args={"engine": engine},
        kv_event_lag_ms=a.kv_event_lag_ms if kv else None,
        capture_per_request=True,
    )
    wall_s = time.monotonic() - started
    s = report.summary
    per_worker = [0] * a.workers
    for r in report.per_request:
        if r.get("decode_worker_idx") is not None:
            per_worker[r["decode_worker_idx"]] += 1

    def seconds(name):
        value = s.get(name)
        return None if value is None else round(value / 1000.0, 6)

    out = {
        "trace": a.trace,
        "router_mode": a.router_mode,
        "workers": a.workers,
        "speedup": a.speedup,
        "requests": s["num_requests"],
        "completed": s["completed_requests"],
        "prefix_cache_reused_ratio": s["prefix_cache_reused_ratio"],
        "first_admission_prefix_cache_reused_ratio": s.get("first_admission_prefix_cache_reused_ratio"),
        "input_tokens": s["total_input_tokens"],
        "output_tokens": s["total_output_tokens"],
        "prefilled_tokens": s.get("committed_prefill_tokens"),
        "ttft_mean_s": seconds("mean_ttft_ms"),
        "ttft_p50_s": seconds("median_ttft_ms"),
        "ttft_p90_s": seconds("p90_ttft_ms"),
        "ttft_p99_s": seconds("p99_ttft_ms"),
        "ttft_max_s": seconds("max_ttft_ms"),
        "tpot_mean_s": seconds("mean_tpot_ms"),
        "tpot_p99_s": seconds("p99_tpot_ms"),
        "e2e_mean_s": seconds("mean_e2e_latency_ms"),
        "e2e_p99_s": seconds("p99_e2e_latency_ms"),
        "duration_s": seconds("duration_ms"),
        "output_tokens_per_s": s.get("output_throughput_tok_s"),
        "requests_per_worker": per_worker,
        "readmissions": sum(r.get("readmission_count") or 0 for r in report.per_request),
        "kv_eviction_policy": s.get("kv_eviction_policy"),
        "wall_s": round(wall_s, 3),
        "engine": engine,
        "router_config": router if kv else None,
    }
    if a.summary:
        out["summary"] = s
    json.dump(out, sys.stdout, default=str)
    print()


if __name__ == "__main__":
    main()
