"""Times promptise's classify_failure in-process on the messages of the given JSONL files.

Usage: python promptise_classify.py CALLS FILE...  Prints one JSON object:
{"calls": N, "messages": M, "ns_per_call_median": x, "ns_per_call_min": y, "version": v}.
The messages are cycled until CALLS calls are made; one untimed warm-up pass first, then five
timed rounds (median and minimum reported). A null error_type is passed as "" (the function
needs a str).
"""

import json
import sys
import time
from importlib.metadata import version

from promptise.strategy import classify_failure


def main() -> None:
    calls = int(sys.argv[1])
    rows = []
    for path in sys.argv[2:]:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    rows.append((d.get("error_type") or "", d["error_message"]))
    batch = [rows[i % len(rows)] for i in range(calls)]
    for t, m in rows:
        classify_failure(t, m)
    rounds = []
    for _ in range(5):
        start = time.perf_counter_ns()
        for t, m in batch:
            classify_failure(t, m)
        rounds.append((time.perf_counter_ns() - start) / calls)
    rounds.sort()
    print(
        json.dumps(
            {
                "calls": calls,
                "messages": len(rows),
                "ns_per_call_median": rounds[2],
                "ns_per_call_min": rounds[0],
                "version": version("promptise"),
            }
        )
    )


if __name__ == "__main__":
    main()
