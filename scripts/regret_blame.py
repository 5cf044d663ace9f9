#!/usr/bin/env python3
"""Where a bench run's regret came from: per stage, which swaps of the oracle's arm for the arm
the policy chose cost the most expected reward over a range of tasks.

    hindsight bench learning --env ENV.toml --seed S --trace T.jsonl --json > /dev/null
    python3 scripts/regret_blame.py ENV.toml T.jsonl [FIRST LAST]   # tasks FIRST..LAST-1 (the trace counts from 0)

For each task it finds the oracle's plan (FORMAT.md: expected reward with infrastructure faults
left out, the task's `when` overrides and any drift in force), then for each stage where the
chosen plan departs from it, the value lost by that stage's arm alone (the other stages kept at
the oracle's). The trace's `regret` and `greedy_regret` columns say how much of a range's
regret was exploration (the chosen plan departing from the policy's own greedy one) and how
much the greedy plan's own mistakes.
"""
import collections
import itertools
import json
import math
import sys
import tomllib


def main():
    if len(sys.argv) not in (3, 5):
        sys.exit("usage: regret_blame.py ENV.toml TRACE.jsonl [FIRST LAST]")
    try:
        with open(sys.argv[1], "rb") as f:
            env = tomllib.load(f)
        lo, hi = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) == 5 else (0, 1 << 62)
        reward = {"success": 1.0, "latency": 0.2, "cost": 0.1, "max_cost": 0.1,
                  **env.get("reward", {})}
        sla = env["sla_ms"]
        stages = env["stage"]
    except OSError as e:
        sys.exit(f"regret_blame.py: cannot read {sys.argv[1]}: {e.strerror}")
    except tomllib.TOMLDecodeError as e:
        sys.exit(f"regret_blame.py: {sys.argv[1]} is not TOML: {e}")
    except KeyError as e:
        sys.exit(f"regret_blame.py: {sys.argv[1]} has no {e.args[0]} (see FORMAT.md)")
    except ValueError:
        sys.exit("regret_blame.py: FIRST and LAST must be whole numbers")

    def numbers(s, a, feats, task):
        arm = stages[s]["arm"][a]
        n = {k: arm.get(k, d) for k, d in
             (("p_success", 1.0), ("p_valid", 1.0), ("latency_ms", 0.0), ("cost", 0.0))}
        for w in arm.get("when", []):
            if all(feats.get(k) == v for k, v in w["match"].items()):
                n.update({k: w[k] for k in n if k in w})
                break
        for d in env.get("drift", []):
            if (task >= d["after_task"] and stages[s]["name"] == d["stage"]
                    and arm["tool"] == d["tool"] and arm["strategy"] == d["strategy"]
                    and all(feats.get(k) == v for k, v in d.get("match", {}).items())):
                n.update({k: d[k] for k in n if k in d})
        return n

    def value(plan, nums):
        p = math.prod(nums[s][a]["p_success"] * nums[s][a]["p_valid"] for s, a in enumerate(plan))
        lat = sum(nums[s][a]["latency_ms"] for s, a in enumerate(plan))
        cost = sum(nums[s][a]["cost"] for s, a in enumerate(plan))
        passed = (reward["success"] - reward["latency"] * min(1.0, lat / sla)
                  - reward["cost"] * min(1.0, cost / reward["max_cost"]))
        return max(0.0, min(1.0, p * passed))

    names = [[f'{a["tool"]}/{a["strategy"]}' for a in st["arm"]] for st in stages]
    plans = list(itertools.product(*[range(len(st["arm"])) for st in stages]))
    blame, count = collections.Counter(), collections.Counter()
    regret = greedy_regret = 0.0
    tasks = 0
    try:
        trace = open(sys.argv[2])
    except OSError as e:
        sys.exit(f"regret_blame.py: cannot read {sys.argv[2]}: {e.strerror}")
    with trace as f:
        for number, line in enumerate(f, 1):
            try:
                row = json.loads(line)
                task, feats, r = int(row["task"]), dict(row["features"]), float(row["regret"])
                g = float(row.get("greedy_regret", r))
                chosen = [names[s].index(arm) for s, arm in enumerate(row["plan"])]
                if len(chosen) != len(stages):
                    raise ValueError("a plan of another length")
            except (ValueError, TypeError, KeyError, IndexError) as e:
                sys.exit(f"regret_blame.py: {sys.argv[2]} line {number} is not a trace line of "
                         f"{sys.argv[1]}: {e}")
            if not lo <= task < hi:
                continue
            tasks += 1
            regret += r
            greedy_regret += g
            nums = [[numbers(s, a, feats, task) for a in range(len(st["arm"]))]
                    for s, st in enumerate(stages)]
            best = max(plans, key=lambda plan: value(plan, nums))
            for s, a in enumerate(chosen):
                if a != best[s]:
                    alt = list(best)
                    alt[s] = a
                    key = (stages[s]["name"], names[s][best[s]], names[s][a])
                    blame[key] += value(best, nums) - value(alt, nums)
                    count[key] += 1
    print(f"{tasks} tasks: regret {regret:.2f}, of which exploration "
          f"{regret - greedy_regret:.2f} (the greedy plans alone would have cost {greedy_regret:.2f})")
    for (stage, best, chosen), lost in blame.most_common(15):
        print(f"{lost:7.2f} over {count[(stage, best, chosen)]:4} tasks: {stage}: {best} -> {chosen}")


if __name__ == "__main__":
    main()
