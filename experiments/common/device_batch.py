"""Batches of GPU jobs for the lent device (one call, several GPUs), from the jobs that commits name.

A commit whose message has lines ``JOB name|timeout_s|tail_chars|command`` (``HOSTJOB`` for a job that times host
overhead: run alone after the others; ``JOB-DROP name`` withdraws one; a later line of a name wins) asks for a run.

    python3 experiments/common/device_batch.py build SINCE N [--lanes 4]   # .whl/snap (HEAD), .whl/gpuN.sh
    (device: carry [".whl"], command "bash .whl/gpuN.sh 2>&1 | tail -c 3000")
    python3 experiments/common/device_batch.py save FILES_AT CALL SESSION JOB AREA [--device h200]   # -> notes/AREA/runs/

The script installs .whl/*.whl (peers as wheels) into /tmp/site, runs each lane's jobs in order on its own GPU
(lanes in parallel, balanced by timeout), then the HOSTJOBs alone, prints each job's tail, and packs $OUT into
one all.tgz: the device returns at most 8 files, so a batch of many jobs lost its logs before it did.
"""
from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def jobs_since(since: str) -> dict[str, tuple[bool, int, int, str]]:
    """name -> (host job, timeout, tail, command) from the JOB lines of since..HEAD's commit messages."""
    log = subprocess.run(["git", "log", "--reverse", "--format=%B%n@@END@@", f"{since}..HEAD"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    jobs: dict[str, tuple[bool, int, int, str]] = {}
    for line in (ln.strip() for ln in log.splitlines()):
        if line.startswith("JOB-DROP "):
            jobs.pop(line[9:].strip(), None)
            continue
        for tag, host in (("JOB ", False), ("HOSTJOB ", True)):
            if line.startswith(tag) and line.count("|") >= 3:
                name, timeout, tail, command = line[len(tag):].split("|", 3)
                jobs[name.strip()] = (host, int(timeout), int(tail), command.strip())
    return jobs


def script(jobs: dict[str, tuple[bool, int, int, str]], lanes: int, budget: int = 540, last: tuple[str, ...] = ()) -> str:
    """Lanes balanced by timeout (jobs whose name contains a string of ``last`` go last in their lane); a job is
    started only if it can end within ``budget`` seconds of the script's start."""
    load, lane_of = [0] * lanes, {}
    order = sorted(jobs.items(), key=lambda kv: (any(m in kv[0] for m in last), -kv[1][1]))
    for name, (host, timeout, _, _) in order:
        if not host:
            lane_of[name] = min(range(lanes), key=load.__getitem__)
            load[lane_of[name]] += timeout

    def job(gpu, name):
        _, timeout, _, command = jobs[name]
        return f"job {gpu} {shlex.quote(name)} {timeout} {shlex.quote(command)}"

    out = ["#!/bin/bash", "set -u", 'W="$(cd "$(dirname "$0")" && pwd)"',
           'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site'
           ' "$W"/*.whl >/dev/null 2>&1 || echo "wheel install failed"',
           'export PYTHONPATH=/tmp/site:"$W/snap"', "nvidia-smi -L", "T0=$(date +%s)",
           f'BUDGET={budget}',
           'job() { local gpu=$1 name=$2 tmo=$3 cmd=$4; mkdir -p "$OUT/$name"; local t=$(date +%s);'
           # a job that could run past the call's budget is not started: a call killed at its limit returns nothing
           ' if [ $(( t - T0 + tmo )) -gt $BUDGET ]; then echo "skipped (budget)" > "$OUT/$name.log";'
           ' echo "skipped 0" > "$OUT/$name.rc"; return; fi;'
           ' (cd "$W/snap" && CUDA_VISIBLE_DEVICES=$gpu OUT="$OUT/$name" timeout -k 10 "$tmo" bash -c "$cmd")'
           ' > "$OUT/$name.log" 2>&1; echo "$? $(( $(date +%s) - t ))" > "$OUT/$name.rc"; }']
    for lane in range(lanes):
        names = [n for n, ln in lane_of.items() if ln == lane]
        if names:
            out.append("( " + "; ".join(job(lane, n) for n in names) + " ) &")
    out.append("wait")
    out += [job(0, n) for n, spec in jobs.items() if spec[0]]
    out.append('echo "TOTAL $(( $(date +%s) - T0 )) s"')
    for name, (_, _, tail, _) in jobs.items():
        out.append(f'echo "=== {name} rc,wall: $(cat "$OUT/{name}.rc" 2>/dev/null)"; tail -c {tail} "$OUT/{name}.log"')
    out.append('(cd "$OUT" && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz all.tgz)')
    return "\n".join(out) + "\n"


def build(since: str, n: int, lanes: int, budget: int = 540, last: tuple[str, ...] = ()) -> None:
    jobs = jobs_since(since)
    snap = ROOT / ".whl" / "snap"
    shutil.rmtree(snap, ignore_errors=True)
    snap.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD", "tilecore", "experiments", "tests", "benchmarks", "examples",
                              "pyproject.toml"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive, check=True)
    (ROOT / ".whl" / f"gpu{n}.sh").write_text(script(jobs, lanes, budget, last))
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f".whl/gpu{n}.sh: {len(jobs)} jobs ({', '.join(jobs)}), snapshot {head.strip()}")


def save(files_at: str, call: int, session: int, job: str, area: str, device: str = "h100") -> None:
    src = Path(files_at)
    if (src / "all.tgz").exists():
        unpacked = Path(f"/tmp/device_call{call}")
        with tarfile.open(src / "all.tgz") as t:
            t.extractall(unpacked)
        src = unpacked
    runs = ROOT / "notes" / area / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    stem = f"{job}_run{call}_session{session}_{device}"  # the card, as the device reply names it
    shutil.copy(src / f"{job}.log", runs / f"{stem}.txt")
    print(runs / f"{stem}.txt")
    for j in sorted((src / job).glob("*.json")):
        shutil.copy(j, runs / f"{stem}_{j.name}")
        print(runs / f"{stem}_{j.name}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    b = sub.add_parser("build")
    b.add_argument("since"), b.add_argument("n", type=int), b.add_argument("--lanes", type=int, default=4)
    b.add_argument("--budget", type=int, default=540), b.add_argument("--last", nargs="*", default=())
    s = sub.add_parser("save")
    for a in ("files_at", "call", "session", "job", "area"):
        s.add_argument(a, type=int if a in ("call", "session") else str)
    s.add_argument("--device", default="h100", choices=("h100", "h200"))
    a = p.parse_args()
    build(a.since, a.n, a.lanes, a.budget, tuple(a.last)) if a.what == "build" else save(a.files_at, a.call, a.session, a.job, a.area,
                                                                              a.device)
