#!/usr/bin/env python3
"""Writes environments in the shape issue 6 names (many arms, heavy infrastructure noise on each
stage's best arm, three or more stages, a drift), drawn independently of `examples/random_env.rs`
so that the bench is measured on files its author did not shape.

    python3 scripts/grader_envs.py FIRST LAST OUTDIR     # writes OUTDIR/g{FIRST..LAST}.toml

Per file: 2-4 features of 2-5 weighted values; 3-5 stages of 5-10 arms, each arm's success
uniform in 0.45-0.97 with validity 0.85-1, latency and cost drawn wide, and 0-2 overrides on one
feature value (a niche at 0.9-0.99 or a weakness at 0.05-0.4); each stage's best arm at
`p_infra` 0.3-0.6 on top of `[infra]` faults at 2-10%; one drift at task 600 on a stage's best
arm to 0.1-0.4 (on one feature value in 70% of files, on every task otherwise). The same seeds
give the same files (Python's `random.Random`): seeds 1-16 are `tests/fixtures/grader/`, which
`tests/learn_independent.rs` learns.
"""
import random
import sys


def gen(seed):
    r = random.Random(seed)
    nf = r.choice([2,3,3,4])
    feats = {}
    for i in range(nf):
        nv = r.choice([2,2,3,3,4,5])
        feats[f"f{i}"] = [f"v{i}{j}" for j in range(nv)]
    weights = {f: [r.choice([1,1,2,3]) for _ in vs] for f, vs in feats.items()}
    ns = r.choice([3,3,4,4,5])
    out = [f'name = "grader-{seed}"', 'goal = "task ' + " ".join("{%s}" % f for f in feats) + '"', f"sla_ms = {r.choice([15000,20000,30000])}", ""]
    out.append("[features]")
    for f, vs in feats.items():
        out.append(f'{f} = {{ values = [{", ".join(repr(v).replace(chr(39),chr(34)) for v in vs)}], weights = {weights[f]} }}')
    out.append("")
    out.append("[infra]\np_fault = %.2f\nerrors = { TransientNetwork = 2, RateLimit = 1, Timeout = 1 }\n" % r.choice([0.02,0.05,0.1]))
    drift = None
    errs = ["Timeout", "SchemaMismatch", "DeterministicFailure", "ToolNotFit", "NotFound"]
    for s in range(ns):
        na = r.randint(5, 10)
        out.append(f'[[stage]]\nname = "s{s}"\n')
        arms = []
        for a in range(na):
            p = round(r.uniform(0.45, 0.97), 2)
            arms.append(dict(tool=f"tool{s}_{a//2}", strategy=f"st{a%2}_{a}", p=p, pv=round(r.uniform(0.85, 1.0), 2),
                             lat=int(r.choice([300,800,1500,3000,6000,10000]) * r.uniform(0.7,1.3)), cost=round(r.uniform(0.0005, 0.03), 4)))
        best = max(range(na), key=lambda i: arms[i]["p"] * arms[i]["pv"])
        for i, a in enumerate(arms):
            out.append("[[stage.arm]]")
            out.append(f'tool = "{a["tool"]}"\nstrategy = "{a["strategy"]}"\ncost = {a["cost"]}\nlatency_ms = {a["lat"]}\np_success = {a["p"]}\np_valid = {a["pv"]}')
            e = r.sample(errs, 2)
            out.append(f"errors = {{ {e[0]} = 2, {e[1]} = 1 }}")
            if i == best:
                out.append(f"p_infra = {r.choice([0.3,0.4,0.5,0.6])}")
            # specialists / weaknesses
            for _ in range(r.choice([0,0,1,1,2])):
                f = r.choice(list(feats)); v = r.choice(feats[f])
                out.append(f'\n[[stage.arm.when]]\nmatch = {{ {f} = "{v}" }}\np_success = {round(r.choice([r.uniform(0.05,0.4), r.uniform(0.9,0.99)]),2)}')
            out.append("")
        if drift is None and (r.random() < 0.5 or s == ns - 1):
            f = r.choice(list(feats)); v = r.choice(feats[f])
            m = "" if r.random() < 0.3 else f'match = {{ {f} = "{v}" }}\n'
            drift = f'[[drift]]\nafter_task = 600\nstage = "s{s}"\ntool = "{arms[best]["tool"]}"\nstrategy = "{arms[best]["strategy"]}"\n{m}p_success = {round(r.uniform(0.1,0.4),2)}\n'
    out.append(drift)
    return "\n".join(out)


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: grader_envs.py FIRST LAST OUTDIR")
    try:
        first, last = int(sys.argv[1]), int(sys.argv[2])
    except ValueError:
        sys.exit(f"grader_envs.py: FIRST and LAST must be whole numbers, not {sys.argv[1]!r} and {sys.argv[2]!r}")
    for seed in range(first, last + 1):
        path = f"{sys.argv[3]}/g{seed}.toml"
        try:
            with open(path, "w") as f:
                f.write(gen(seed))
        except OSError as e:
            sys.exit(f"grader_envs.py: cannot write {path}: {e.strerror}")


if __name__ == "__main__":
    main()
