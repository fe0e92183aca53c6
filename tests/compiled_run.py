"""Compile-and-inspect snippets run in a fresh Python without TRITON_INTERPRET: the test session runs under the
interpreter (conftest), so a test that asserts on sm_90a PTX, registers or spills compiles in a subprocess."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: snippets run from it unless told


def _stdout(args, timeout, cwd, env):
    run_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run_env.update(env or {})
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=run_env, timeout=timeout,
                       cwd=cwd or ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def command_json(args, timeout=900, cwd=None, env=None):
    """Run ``python *args`` without TRITON_INTERPRET (``env`` entries added) and return the JSON of its stdout
    (the whole of it, or its last line when earlier lines are other output); a run that exits non-zero fails
    the test with its stderr's tail."""
    out = _stdout(args, timeout, cwd, env)
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        return json.loads(out.strip().splitlines()[-1])


def compiled_json(code, *argv, timeout=900, cwd=None, env=None):
    """``command_json`` of ``python -c code *argv``."""
    return command_json(["-c", code, *argv], timeout=timeout, cwd=cwd, env=env)


def compiled_json_lines(code, *argv, timeout=900, cwd=None, env=None):
    """For a snippet that prints one JSON object a line: the objects of the lines that start with ``{``, in
    order."""
    out = _stdout(["-c", code, *argv], timeout, cwd, env)
    return [json.loads(line) for line in out.strip().splitlines() if line.startswith("{")]
