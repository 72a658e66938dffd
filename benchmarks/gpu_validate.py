"""One prepared GPU validation run: six checks, each PASS / FAIL / SKIP with its reason and time, a JSON summary.

    bash benchmarks/gpu_validate.sh [--dry-run] [--out DIR]     # the wrapper picks the python and the environment
    python benchmarks/gpu_validate.py [--dry-run] [--out DIR] [--only NAME ...] [--budget-s 480]

Checks (docs/gpu.md says what each proves and why its timeout is what it is):

1. ``kernels``         the CUDA / Triton / torch KV export-import kernels against the reference (tests/unit/kernels/
                       test_kv_gpu.py run under pytest on the GPU, its JUnit report parsed)
2. ``busy_switch``     a front over 3 tiny-Llama instances; greedy references, then the same requests with the busiest
                       decode instance switched under load: identical ``output_ids`` and ``taken >= 2``
3. ``memory_release``  ``/release_memory_occupation`` then ``/resume_memory_occupation`` on the front with a
                       ``/prorsa/switch`` racing it: both answered 200, the switch done or held (409
                       ``control_operation``), a switch while released held, generation after resume = reference
4. ``routed_experts``  the tiny Qwen2-MoE with ``--enable-return-routed-experts``: requests swept off a decode
                       instance while they decode report the same computed ``routed_experts`` rows as unmoved
5. ``tp2``             with two GPUs visible: the busy switch of (2) with ``--tp-size 2``: identical ``output_ids``,
                       and each rank's blocks under its own keys (store entries = 2 x the blocks rank 0 persisted,
                       none refused for layout); SKIP with one GPU
6. ``dp2``             with two GPUs visible: the busy switch of (2) on the tiny MoE with ``--tp-size 2
                       --attn-dp-size 2`` (two attention-DP groups, each leading itself): identical ``output_ids``,
                       store entries = the blocks both leaders persisted, none refused; SKIP with one GPU

Each check runs in a forked child process with a hard timeout (the child and every server it started are killed
when it runs over), inside a total budget (``--budget-s``, 8 minutes by default): a check that would start with too
little of it left is a SKIP. The summary (``gpu_validate.json``) is rewritten after every check, so a run cut off from
outside still leaves what it found. Logs of the servers stay in the work directory (``--work-dir``, a fresh temp dir
by default); the summary carries the last lines of each log of a check that did not pass.

``--dry-run`` starts no server and touches no GPU: it checks the wiring (arguments, every check registered with a
plan, the model generators importable) and writes the summary with the commands each check would run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results" / "gpu_validate"
SUMMARY_NAME = "gpu_validate.json"
MAX_BUDGET_S = 480.0  # the issue's bound for one H200 / H100: the one-GPU checks' timeouts must fit in it
MIN_START_S = 20.0  # a check is not started with less than this left in the budget
KERNEL_TEST = REPO / "tests" / "unit" / "kernels" / "test_kv_gpu.py"
LAUNCH_MODULE = "sglang_prorsa.launch_server"

# SGLang flags of every front's instances on the GPU. Three instances share one GPU (no GPU is assigned per instance):
# SGLang sizes its KV pool as (free memory after load) - (free memory at start) x (1 - fraction), so a high fraction
# with a token cap lets three start side by side. Triton attention and the torch sampler need no JIT download or
# compile of FlashInfer kernels. The random-weight models' logits are flat, so greedy choices sit near ties that a
# different batching flips (on CPU, fp32, an unmoved request of a busy-switch run differed from its reference at token
# 282 of 300): deterministic inference (batch-invariant kernels; Triton attention keeps the radix cache there) and
# fp32 (the generated models' dtype) make "identical" a statement about the move, not about batch order.
# Overridable with --engine-flags.
ENGINE_FLAGS = ("--attention-backend triton --sampling-backend pytorch --enable-deterministic-inference "
                "--dtype float32 --mem-fraction-static 0.85 --max-total-tokens 65536 --chunked-prefill-size 1024 "
                "--cuda-graph-max-bs 32 --log-level warning")
SWITCH_MAX_NEW = 512  # a few seconds of decoding on a GPU: the switch lands while the requests run

PASS, FAIL, SKIP, PLANNED = "PASS", "FAIL", "SKIP", "PLANNED"


class Skip(Exception):
    """Raised by a check whose prerequisite is missing (no CUDA, no sglang, one GPU): recorded as SKIP."""


@dataclass
class Context:
    """What a check gets: its own work directory, the probed environment, the engine flags and its deadline."""

    work: Path
    env: dict
    engine_flags: list[str]
    python: str = sys.executable
    deadline: float = float("inf")  # time.monotonic() by which the check is killed
    details: dict = field(default_factory=dict)  # filled as the check goes: kept in the summary whatever the outcome

    def remaining(self, margin: float = 0.0) -> float:
        return max(1.0, self.deadline - time.monotonic() - margin)

    def track(self, pid: int) -> None:
        """Record a process group this check started, so the runner can end it if the check is killed."""
        with open(self.work / "pids", "a") as f:
            f.write(f"{pid}\n")

    def require(self, *, cuda: bool = True, sglang: bool = False, gpus: int = 1) -> None:
        env = self.env
        if cuda and not env.get("cuda_available"):
            raise Skip(f"no CUDA device visible to {env.get('executable', self.python)} "
                       f"({env.get('torch_error') or 'torch.cuda.is_available() is False'})")
        if sglang and not env.get("sglang"):
            raise Skip(f"sglang is not importable by {env.get('executable', self.python)}: "
                       f"{env.get('sglang_error', 'unknown')} (set PYTHON to an interpreter with the project's "
                       "requirements installed)")
        if env.get("device_count", 0) < gpus:
            raise Skip(f"needs {gpus} GPUs, {env.get('device_count', 0)} visible")


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    timeout_s: float
    run: Callable[[Context], dict]
    plan: Callable[[Context], list[str]]
    expected: str | None = None  # a known limitation: a FAIL is reported, and the summary says it was expected
    gpus: int = 1  # a check needing more skips at once on a smaller machine, and its time is not budgeted there


# ------------------------------------------------------------------------------------------------------- the runner


def _log_tails(work: Path, lines: int = 40, files: int = 8) -> dict[str, str]:
    logs = sorted(work.rglob("*.log"), key=lambda p: p.stat().st_mtime, reverse=True)[:files]
    out = {}
    for p in logs:
        try:
            out[str(p.relative_to(work))] = "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            continue
    return out


def _execute(check: Check, ctx: Context) -> dict:
    """Run one check in this process: PASS with its details, SKIP on ``Skip``, FAIL on anything else raised."""
    try:
        found = check.run(ctx) or {}
        status, reason = PASS, str(found.pop("reason", "ok"))
        ctx.details.update(found)
        tb = None
    except Skip as e:
        status, reason, tb = SKIP, str(e), None
    except Exception as e:  # a check that raises anything else is a FAIL with its reason
        status, reason = FAIL, f"{type(e).__name__}: {e}".strip()
        tb = traceback.format_exc(limit=12)
    out: dict[str, Any] = {"status": status, "reason": reason[:4000], "details": _jsonable(ctx.details)}
    if tb:
        out["traceback"] = tb[-6000:]
    return out


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def _child(check: Check, ctx: Context, result_path: Path) -> None:
    os.setpgrp()  # its own group: the runner ends it (and what it started without a new session) in one signal
    result = _execute(check, ctx)
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, result_path)
    sys.stdout.flush()
    os._exit(0)  # no atexit hooks of the parent (pytest's, say) in the forked child


def _end_tracked(work: Path, grace_s: float = 8.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process group the check recorded (servers it started, by their ids)."""
    try:
        pids = sorted({int(x) for x in (work / "pids").read_text().split()})
    except (OSError, ValueError):
        return []
    live = []
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
            live.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        live = [p for p in live if _group_alive(p)]
        time.sleep(0.2)
    for pid in live:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def run_check(check: Check, ctx: Context, timeout_s: float) -> dict:
    """Run ``check`` in a forked child under a hard timeout; the record the summary keeps for it."""
    ctx.work.mkdir(parents=True, exist_ok=True)
    result_path = ctx.work / "result.json"
    result_path.unlink(missing_ok=True)
    t0 = time.monotonic()
    ctx.deadline = t0 + timeout_s
    sys.stdout.flush()
    sys.stderr.flush()
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(check, ctx, result_path),
                                                       name=f"check-{check.name}")
    proc.start()
    proc.join(timeout_s)
    timed_out = proc.is_alive()
    if timed_out:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own group (os.setpgrp in _child)
        except ProcessLookupError:
            pass
        proc.join(10)
    _end_tracked(ctx.work)  # servers left behind by a killed or crashed check (a passed one stopped its own)
    seconds = time.monotonic() - t0
    if timed_out:
        result = {"status": FAIL, "reason": f"timed out after {timeout_s:.0f} s: killed with every server it started",
                  "details": {}}
    else:
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            result = {"status": FAIL, "reason": f"the check's process exited with code {proc.exitcode} and left no "
                                                "result", "details": {}}
    record = {"name": check.name, "title": check.title, "status": result["status"], "reason": result["reason"],
              "seconds": round(seconds, 1), "timeout_s": round(timeout_s, 1), **result}
    if check.expected:
        record["expected"] = check.expected
    if record["status"] == FAIL:
        record["log_tails"] = _log_tails(ctx.work)
    return record


def probe_environment(python: str, timeout_s: float = 90.0) -> dict:
    """torch / CUDA / sglang as the interpreter that runs the servers sees them (in a subprocess: this process never
    initialises CUDA, so forking a check stays safe)."""
    code = r"""
import json, sys
info = {"executable": sys.executable, "python": sys.version.split()[0]}
try:
    import torch
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    info["device_count"] = torch.cuda.device_count() if info["cuda_available"] else 0
    info["devices"] = [torch.cuda.get_device_name(i) for i in range(info["device_count"])]
except Exception as e:
    info.update(cuda_available=False, device_count=0, torch_error=f"{type(e).__name__}: {e}")
for mod in ("sglang", "sglang_prorsa", "triton", "pytest"):
    try:
        m = __import__(mod)
        info[mod] = getattr(m, "__version__", None) or getattr(m, "__file__", None) or "present"
    except Exception as e:
        info[mod + "_error"] = f"{type(e).__name__}: {e}"[:300]
print("PROBE " + json.dumps(info))
"""
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout_s, cwd="/tmp")
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"executable": python, "cuda_available": False, "device_count": 0, "probe_error": str(e)}
    for line in out.stdout.splitlines():
        if line.startswith("PROBE "):
            return json.loads(line[6:])
    return {"executable": python, "cuda_available": False, "device_count": 0,
            "probe_error": (out.stderr or out.stdout)[-1500:]}


# ------------------------------------------------------------------------------------------ helpers of the checks


def _model_dir(kind: str) -> Path:
    """Where ``ensure_default_model()`` / ``ensure_moe_model()`` keep (or will write) the generated model."""
    from sglang_prorsa.srt.common.paths import cache_root
    from sglang_prorsa.testing.tiny_model import TinyModelSpec
    from sglang_prorsa.testing.tiny_moe import TinyMoeSpec

    if kind == "moe":
        return Path(cache_root()) / "models" / f"tiny-qwen2moe-{TinyMoeSpec().key()}"
    return Path(cache_root()) / "models" / f"tiny-llama-{TinyModelSpec().key()}"


def front_argv(model: str | Path, port: int | str, store: str | Path, log_dir: str | Path,
               engine_flags: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    return ["--model-path", str(model), "--pd-adaptive", "--prorsa-instances", "3", "--prorsa-initial-prefill", "1",
            "--prorsa-manual-switch", "--prorsa-min-dwell", "0", "--prorsa-dwell-switch-costs", "0",
            "--prorsa-share-gpus",
            "--host", "127.0.0.1", "--port", str(port), "--prorsa-kv-store", "file", "--prorsa-kv-store-path",
            str(store), "--prorsa-log-dir", str(log_dir), *engine_flags, *extra]


def _front_command(ctx: Context, name: str, model: str, extra: Sequence[str] = ()) -> str:
    argv = front_argv(model, "<free port>", ctx.work / f"{name}-kv", ctx.work / name, ctx.engine_flags, extra)
    return shlex.join([ctx.python, "-m", LAUNCH_MODULE, *argv])


@contextmanager
def running_front(ctx: Context, name: str, model: Path, extra: Sequence[str] = ()) -> Iterator[tuple[Any, Path]]:
    """A front over three instances (1 prefill : 2 decode), manual switches, file KV store; stopped on exit."""
    from sglang_prorsa.srt.utils import processes

    port = processes.free_port()
    store = ctx.work / f"{name}-kv"
    store.mkdir(parents=True, exist_ok=True)
    argv = front_argv(model, port, store, ctx.work / name, ctx.engine_flags, extra)
    ctx.details.setdefault("commands_run", []).append(shlex.join([sys.executable, "-m", LAUNCH_MODULE, *argv]))
    srv = processes.start(argv, name=name, port=port, log_dir=ctx.work, die_with_parent=True)
    ctx.track(srv.pid)
    try:
        ctx.details[f"{name}_ready_s"] = round(srv.wait_ready(timeout=ctx.remaining(margin=15)), 1)
        yield srv, store
    finally:
        srv.stop(grace_s=10)


def _moved(out: dict) -> bool:
    return bool(out.get("meta_info", {}).get("prorsa", {}).get("migrations"))


def _engine_counter(url: str, name: str, counters: str = "engine_counters") -> int:
    """``name`` summed over the front's instances, from ``engine_counters`` (the engine side's) or ``counters``
    (the scheduler's) of each ``/prorsa/status``."""
    from sglang_prorsa.testing.front_client import instance_status, instances

    return sum(int(instance_status(i["url"]).get(counters, {}).get(name, 0)) for i in instances(url))


def busy_switch_round(ctx: Context, url: str, n: int = 16, max_new: int = SWITCH_MAX_NEW,
                      min_running: int = 4) -> dict:
    """References first, then the same greedy requests with the busiest decode instance switched to prefill while
    they decode. Fills ``ctx.details`` as it goes; raises AssertionError naming what differed."""
    from sglang_prorsa.testing.front_client import busiest, distinct_prompts, generate, run_all, switch_under_load

    prompts = distinct_prompts(n, lambda i: 24 + 3 * i, seed=1)
    t0 = time.monotonic()
    ref = run_all(lambda p: generate(url, p, max_new, logprobs=False, timeout=ctx.remaining()), prompts)
    ctx.details["reference_s"] = round(time.monotonic() - t0, 2)
    bad = [(s, str(o)[:300]) for s, o in ref if s != 200]
    assert not bad, f"reference requests failed: {bad[:3]}"
    resumed_before = _engine_counter(url, "resumed")
    t0 = time.monotonic()
    sw, got, before = switch_under_load(url, lambda p: generate(url, p, max_new, logprobs=False,
                                                                timeout=ctx.remaining()),
                                        prompts, lambda: busiest(url, "decode"), "prefill",
                                        ready=lambda st: st["running"] >= min_running, settle_s=0.2,
                                        timeout_s=ctx.remaining(margin=30))
    ctx.details["switched_run_s"] = round(time.monotonic() - t0, 2)
    report = sw.json() if sw.headers.get("content-type", "").startswith("application/json") else {"text": sw.text}
    ctx.details["switch"] = {"status": sw.status_code, "instance": before.get("instance"),
                             "running_before": before.get("running"),
                             **{k: report.get(k) for k in ("old_role", "new_role", "taken", "persisted_bytes",
                                                           "released_elsewhere", "text", "code") if k in report}}
    mismatched = []
    for i, ((_, r), (s, out)) in enumerate(zip(ref, got)):
        if s != 200 or out.get("output_ids") != r["output_ids"]:
            a, b = r["output_ids"], out.get("output_ids") or []
            first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            mismatched.append({"request": i, "status": s, "first_difference": first, "moved": _moved(out),
                               "error": None if s == 200 else str(out)[:300]})
    moved = sum(_moved(out) for s, out in got if s == 200)
    ctx.details.update(moved=moved, mismatched=mismatched, requests=n, max_new_tokens=max_new,
                       resumed=_engine_counter(url, "resumed") - resumed_before)
    assert sw.status_code == 200, f"switch answered {sw.status_code}: {sw.text[:500]}"
    unmoved = sum(not m["moved"] for m in mismatched if m["status"] == 200)
    assert not mismatched, (f"{len(mismatched)} of {n} outputs differ from the reference ({unmoved} of them never "
                            f"moved: batch-order numerics, not the move): {mismatched[:4]}")
    taken = int(report.get("taken") or 0)
    assert taken >= 2, f"the switch took {taken} running requests (< 2): it came too late to test a move"
    return {"reason": f"{n} outputs identical; switch took {taken}, {moved} answers moved, "
                      f"{report.get('persisted_bytes')} bytes persisted"}


# ---------------------------------------------------------------------------------------------------- the checks


def _pytest_argv(ctx: Context) -> list[str]:
    return [ctx.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rs",
            "--junitxml", str(ctx.work / "junit.xml"), str(KERNEL_TEST)]


def plan_kernels(ctx: Context) -> list[str]:
    return ["cd /tmp && " + shlex.join(_pytest_argv(ctx))]


def check_kernels(ctx: Context) -> dict:
    ctx.require(cuda=True)
    argv = _pytest_argv(ctx)
    ctx.details["commands_run"] = [shlex.join(argv)]
    with open(ctx.work / "pytest.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd="/tmp", stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        ctx.track(proc.pid)
        try:
            rc = proc.wait(timeout=ctx.remaining(margin=5))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("pytest of test_kv_gpu.py ran past the check's timeout (the CUDA extension build "
                                 "is the slow part: is SGLANG_PRORSA_EXT_DIR cached?)") from None
    ctx.details["pytest_rc"] = rc
    try:
        suite = ET.parse(ctx.work / "junit.xml").getroot()
    except (OSError, ET.ParseError) as e:
        tail = (ctx.work / "pytest.log").read_text(errors="replace")[-2000:]
        raise AssertionError(f"pytest exited {rc} without a JUnit report ({e}): {tail}") from None
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert suite is not None, "empty JUnit report"
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in suite.iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            failed.append(f"{case.get('name')}: {(bad.get('message') or '')[:200]}")
    skip_reasons = sorted({(c.find("skipped").get("message") or "")[:120] for c in suite.iter("testcase")
                           if c.find("skipped") is not None})
    ctx.details.update(counts=counts, failed=failed[:20], skip_reasons=skip_reasons)
    if counts["tests"] and counts["skipped"] == counts["tests"]:
        raise Skip(f"every kernel test skipped: {skip_reasons}")
    assert rc == 0 and not failed, f"pytest exited {rc}; {len(failed)} failed: {failed[:5]}"
    passed = counts["tests"] - counts["skipped"]
    return {"reason": f"{passed} kernel tests passed ({counts['skipped']} skipped by parametrisation: "
                      f"{'; '.join(skip_reasons)[:200]})"}


def plan_busy_switch(ctx: Context) -> list[str]:
    return [_front_command(ctx, "busy_switch", str(_model_dir("dense"))),
            f"16 greedy /generate ({SWITCH_MAX_NEW} new tokens) through the front: the reference",
            "the same 16 again; POST /prorsa/switch {busiest decode -> prefill} once it runs >= 4: identical "
            "output_ids, taken >= 2"]


def check_busy_switch(ctx: Context) -> dict:
    ctx.require(cuda=True, sglang=True)
    from sglang_prorsa.testing.tiny_model import ensure_default_model

    model = ensure_default_model()
    with running_front(ctx, "busy_switch", model) as (srv, _):
        return busy_switch_round(ctx, srv.url)


def plan_memory_release(ctx: Context) -> list[str]:
    return [_front_command(ctx, "memory_release", str(_model_dir("dense")), ["--enable-memory-saver"]),
            "4 greedy /generate (64 new tokens): the reference",
            "POST /prorsa/switch {busiest decode -> prefill} racing POST /release_memory_occupation {}: release 200, "
            "switch 200 or 409 control_operation",
            "POST /prorsa/switch while released: 409 control_operation",
            "POST /resume_memory_occupation {}: 200; the 4 requests again = reference; a switch now: 200"]


def _gpu_memory_used_mib() -> list[int] | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=15)
        return [int(x) for x in out.stdout.split()] if out.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def _switchable(url: str) -> tuple[str, str]:
    """(instance, new role) for a switch the front may start: from the role that has more than one active member."""
    from sglang_prorsa.testing.front_client import instances

    insts = [i for i in instances(url) if i["status"] == "active"]
    for role, other in (("decode", "prefill"), ("prefill", "decode")):
        members = [i for i in insts if i["role"] == role]
        if len(members) > 1:
            return members[0]["instance"], other
    raise AssertionError(f"no role has two active instances: {[(i['instance'], i['role']) for i in insts]}")


def _body(r: Any) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text[:500]


def _code(r: Any) -> Any:
    body = _body(r)
    return body.get("code") if isinstance(body, dict) else None


def check_memory_release(ctx: Context) -> dict:
    ctx.require(cuda=True, sglang=True)
    import requests

    from sglang_prorsa.testing.front_client import busiest, distinct_prompts, generate, run_all, switch
    from sglang_prorsa.testing.tiny_model import ensure_default_model

    model = ensure_default_model()
    prompts = distinct_prompts(4, lambda i: 30 + i, seed=25)
    d = ctx.details
    with running_front(ctx, "memory_release", model, ["--enable-memory-saver"]) as (srv, _):
        url = srv.url
        ref = run_all(lambda p: generate(url, p, 64, logprobs=False), prompts)
        assert all(s == 200 for s, _ in ref), f"reference failed: {[str(o)[:200] for s, o in ref if s != 200]}"
        d["gpu_memory_mib_before"] = _gpu_memory_used_mib()
        target = busiest(url, "decode")["instance"]
        box: dict = {}
        racer = threading.Thread(target=lambda: box.setdefault("switch", switch(url, target, "prefill",
                                                                                timeout_s=ctx.remaining())))
        racer.start()
        time.sleep(0.02)
        rel = requests.post(url + "/release_memory_occupation", json={}, timeout=ctx.remaining())
        racer.join(ctx.remaining())
        sw = box.get("switch")
        d["release"] = {"status": rel.status_code, "body": _body(rel)}
        d["racing_switch"] = {"status": getattr(sw, "status_code", None), "body": _body(sw) if sw is not None else None}
        d["gpu_memory_mib_released"] = _gpu_memory_used_mib()
        assert rel.status_code == 200, f"release answered {rel.status_code}: {rel.text[:500]}"
        assert sw is not None, "the racing switch never answered"
        assert sw.status_code == 200 or (sw.status_code == 409 and _code(sw) == "control_operation"), (
            f"racing switch answered {sw.status_code} {sw.text[:300]} (wanted 200 or 409 control_operation)")
        inst, role = _switchable(url)
        held = switch(url, inst, role, timeout_s=ctx.remaining())
        d["switch_while_released"] = {"instance": inst, "new_role": role, "status": held.status_code,
                                      "body": _body(held)}
        assert held.status_code == 409 and _code(held) == "control_operation", (
            f"a switch while released answered {held.status_code} {held.text[:300]}")
        res = requests.post(url + "/resume_memory_occupation", json={}, timeout=ctx.remaining())
        d["resume"] = {"status": res.status_code, "body": _body(res)}
        d["gpu_memory_mib_resumed"] = _gpu_memory_used_mib()
        assert res.status_code == 200, f"resume answered {res.status_code}: {res.text[:500]}"
        again = run_all(lambda p: generate(url, p, 64, logprobs=False), prompts)
        differ = [i for i, ((_, a), (s, b)) in enumerate(zip(ref, again))
                  if s != 200 or b.get("output_ids") != a["output_ids"]]
        d["differ_after_resume"] = differ
        assert not differ, f"after resume, requests {differ} differ from the reference"
        inst, role = _switchable(url)
        after = switch(url, inst, role, timeout_s=ctx.remaining())
        d["switch_after_resume"] = {"instance": inst, "new_role": role, "status": after.status_code}
        assert after.status_code == 200, f"a switch after resume answered {after.status_code}: {after.text[:300]}"
    return {"reason": f"release/resume 200; racing switch {sw.status_code}"
                      f"{' (held: control_operation)' if sw.status_code == 409 else ' (done)'}; held while released; "
                      "generation after resume = reference"}


MOE_MAX_NEW = 768  # still decoding on a GPU when the sweep comes (a tiny model decodes in milliseconds a step)


def plan_routed_experts(ctx: Context) -> list[str]:
    return [_front_command(ctx, "routed_experts", str(_model_dir("moe")), ["--enable-return-routed-experts"]),
            f"3 greedy /generate with return_routed_experts ({MOE_MAX_NEW} new tokens) through the front: the "
            "reference",
            "the same 3 as PD pairs straight to one decode instance; POST <decode>/prorsa/migrate_out while all run; "
            "compare output_ids and the computed routed_experts rows"]


def check_routed_experts(ctx: Context) -> dict:
    ctx.require(cuda=True, sglang=True)
    import numpy as np
    import requests

    from sglang_prorsa.testing.front_client import distinct_prompts, instance_status, instances
    from sglang_prorsa.testing.tiny_moe import TinyMoeSpec, ensure_moe_model

    spec = TinyMoeSpec()
    model = ensure_moe_model(spec)
    prompts = distinct_prompts(3, lambda i: 20 + 7 * i, seed=37)
    kinds = ((False, None), (False, "prompt"), (True, None))  # (stream, routed_experts_start_len)
    d = ctx.details

    from sglang_prorsa.testing import routed_requests

    def body(prompt: list[int], stream: bool, start: Any) -> dict:
        return routed_requests.routed_body(prompt, MOE_MAX_NEW, stream, start)

    def post(url: str, payload: dict) -> dict:
        return routed_requests.post(url, payload, timeout=ctx.remaining())

    def pair_post(prefill: dict, decode: dict, payload: dict) -> dict:
        return routed_requests.pair_post(prefill, decode, payload, timeout=ctx.remaining())

    def rows(answer: dict) -> Any:
        return routed_requests.rows(answer, spec.layers, spec.top_k)

    with running_front(ctx, "routed_experts", model, ["--enable-return-routed-experts"]) as (srv, _):
        url = srv.url
        with ThreadPoolExecutor(len(prompts)) as ex:
            ref = list(ex.map(lambda a: post(url, body(*a)), [(p, s, st) for p, (s, st) in zip(prompts, kinds)]))
        for answer in ref:
            assert len(answer["output_ids"]) == MOE_MAX_NEW and "routed_experts" in answer["meta_info"], \
                str(answer["meta_info"])[:500]
        insts = instances(url)
        (prefill,) = [i for i in insts if i["role"] == "prefill"]
        swept, _other = sorted((i for i in insts if i["role"] == "decode"), key=lambda i: i["instance"])
        with ThreadPoolExecutor(len(prompts)) as ex:
            futures = [ex.submit(pair_post, prefill, swept, body(p, s, st)) for p, (s, st) in zip(prompts, kinds)]
            deadline = time.monotonic() + min(60.0, ctx.remaining(margin=20))
            while instance_status(swept["url"])["running"] < len(prompts):
                assert time.monotonic() < deadline, "the requests never all ran on the decode instance to sweep"
                assert not any(f.done() for f in futures), "a request finished before the sweep: raise MOE_MAX_NEW"
                time.sleep(0.01)
            time.sleep(0.1)
            sweep = requests.post(swept["url"] + "/prorsa/migrate_out", timeout=ctx.remaining())
            moved = [f.result() for f in futures]
        assert sweep.status_code == 200, sweep.text[:500]
        taken = [r for r in sweep.json()["requests"] if r["stage"] == "running"]
        d["swept"] = {"instance": swept["instance"], "taken_running": len(taken)}
        requests.post(swept["url"] + "/prorsa/admission", json={"accept": True}, timeout=10)
        assert len(taken) == len(prompts), f"the sweep took {len(taken)} running requests of {len(prompts)}"
        per_request = []
        for prompt, a, b, (stream, start) in zip(prompts, ref, moved, kinds):
            moves = [m for m in b["meta_info"].get("prorsa", {}).get("migrations", []) if m["stage"] == "running"]
            ra, rb = rows(a), rows(b)
            first = len(prompt) if start == "prompt" else 0
            differ = [i + first for i in range(min(len(ra), len(rb)))
                      if i + first >= len(prompt) and not np.array_equal(ra[i], rb[i])]
            per_request.append({"stream": stream, "start": first, "moves": len(moves),
                                "tokens_kept": moves[0]["tokens_kept"] if moves else None,
                                "kv_tokens": moves[0]["kv_tokens"] if moves else None,
                                "output_ids_equal": a["output_ids"] == b["output_ids"],
                                "rows": [len(ra), len(rb)], "rows_differ": len(differ), "first_differ": differ[:8]})
        d["requests"] = per_request
        for r in per_request:
            assert r["moves"] == 1 and r["kv_tokens"], f"not resumed from its KV once: {r}"
            assert r["output_ids_equal"], f"output_ids differ from the unmoved run: {r}"
            assert r["rows"][0] == r["rows"][1] and r["rows_differ"] == 0, f"routed_experts differ: {r}"
    return {"reason": f"{len(prompts)} requests moved off instance {swept['instance']} mid-decode: output_ids and "
                      "computed routed_experts rows equal the unmoved run's"}


def plan_tp2(ctx: Context) -> list[str]:
    return ["skipped unless torch.cuda.device_count() >= 2",
            _front_command(ctx, "tp2", str(_model_dir("dense")), ["--tp-size", "2"]),
            "the busy switch of busy_switch (16 requests, busiest decode -> prefill): identical output_ids, "
            "taken >= 2; store entries = 2 x kv_blocks_persisted (one key set per TP rank), kv_layout_refused = 0"]


def _store_entries(store: Path) -> list[str]:
    return sorted(p.relative_to(store).as_posix() for p in store.rglob("*")
                  if p.is_file() and not p.name.startswith(".tmp-"))  # a write in progress is not an entry


def _keys_per_rank(ctx: Context, url: str, store: Path, key_sets: int) -> tuple[int, int]:
    """Each rank persists its own shard under its own keys (rank in the key layout): the store holds ``key_sets``
    entries per block the leaders persisted (status counters are each group's leader's, summed over DP ranks)."""
    files = _store_entries(store)
    blocks = _engine_counter(url, "kv_blocks_persisted", counters="counters")
    refused = _engine_counter(url, "kv_layout_refused", counters="counters")
    ctx.details["kv_store"] = {"files": len(files), "leader_blocks": blocks, "layout_refused": refused,
                               "bytes": sum((store / f).stat().st_size for f in files)}
    assert blocks > 0 and len(files) == key_sets * blocks, (f"store entries {len(files)} != {key_sets} x {blocks} "
                                                            "blocks the leaders persisted")
    assert refused == 0, f"{refused} loads refused for their layout"
    return len(files), blocks


def check_tp2(ctx: Context) -> dict:
    ctx.require(cuda=True, sglang=True, gpus=2)
    from sglang_prorsa.testing.tiny_model import ensure_default_model

    model = ensure_default_model()
    with running_front(ctx, "tp2", model, ["--tp-size", "2"]) as (srv, store):
        result = busy_switch_round(ctx, srv.url)
        files, blocks = _keys_per_rank(ctx, srv.url, store, key_sets=2)
        return {"reason": result["reason"] + f"; {files} store entries = 2 ranks x {blocks} blocks"}


DP2_FLAGS = ["--tp-size", "2", "--attn-dp-size", "2"]


def plan_dp2(ctx: Context) -> list[str]:
    return ["skipped unless torch.cuda.device_count() >= 2",
            _front_command(ctx, "dp2", str(_model_dir("moe")), DP2_FLAGS),
            "the busy switch of busy_switch on the tiny MoE (attention DP needs a model whose attention runs "
            "data-parallel; SGLang's Llama does not): identical output_ids, taken >= 2; both DP ranks served; store "
            "entries = kv_blocks_persisted summed over the two attention-DP leaders (attention TP 1: one key set), "
            "kv_layout_refused = 0"]


def check_dp2(ctx: Context) -> dict:
    ctx.require(cuda=True, sglang=True, gpus=2)
    from sglang_prorsa.testing.front_client import instance_status, instances
    from sglang_prorsa.testing.tiny_moe import ensure_moe_model

    model = ensure_moe_model()
    with running_front(ctx, "dp2", model, DP2_FLAGS) as (srv, store):
        result = busy_switch_round(ctx, srv.url)
        files, blocks = _keys_per_rank(ctx, srv.url, store, key_sets=1)
        # two DP ranks per instance, each its own channel: the merged capacity is twice one rank's
        caps = {i["instance"]: instance_status(i["url"]).get("kv_capacity_tokens") for i in instances(srv.url)}
        ctx.details["kv_capacity_tokens"] = caps
        return {"reason": result["reason"] + f"; {files} store entries = {blocks} blocks of two attention-DP leaders"}


CHECKS: tuple[Check, ...] = (
    Check("kernels", "KV export/import kernels (CUDA, Triton, torch) = reference and CPU build", 120.0,
          check_kernels, plan_kernels),
    Check("busy_switch", "busy switch of the busiest decode instance: identical output_ids, taken >= 2", 110.0,
          check_busy_switch, plan_busy_switch),
    Check("memory_release", "memory release/resume through the front with a switch racing it", 80.0,
          check_memory_release, plan_memory_release),
    Check("routed_experts", "routed experts of moved requests = unmoved run (tiny MoE)", 80.0,
          check_routed_experts, plan_routed_experts),
    Check("tp2", "TP 2 persist/resume across a busy switch, one key set per rank", 90.0, check_tp2, plan_tp2, gpus=2),
    Check("dp2", "attention DP 2 persist/resume across a busy switch, a leader per DP group", 90.0, check_dp2,
          plan_dp2, gpus=2),
)


# ------------------------------------------------------------------------------------------------------- the driver


def _write_summary(out: Path, summary: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / SUMMARY_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def _print_record(r: dict) -> None:
    note = f" [expected: {r['expected']}]" if r.get("expected") and r["status"] != PASS else ""
    print(f"[{r['status']}] {r['name']} ({r['seconds']:.1f} s of {r['timeout_s']:.0f}): {r['reason']}{note}",
          flush=True)


def dry_run(checks: tuple[Check, ...], out: Path, engine_flags: list[str], budget_s: float) -> tuple[dict, int]:
    """Wiring only: every check planned, the generators importable, the summary written. No server, no GPU."""
    errors: list[str] = []
    wiring: dict[str, Any] = {}
    for mod, fn in (("sglang_prorsa.testing.tiny_model", "ensure_default_model"),
                    ("sglang_prorsa.testing.tiny_moe", "ensure_moe_model"),
                    ("sglang_prorsa.testing.front_client", "switch_under_load"),
                    ("sglang_prorsa.testing.routed_requests", "pair_post"),
                    ("sglang_prorsa.srt.utils.processes", "start")):
        try:
            ok = callable(getattr(importlib.import_module(mod), fn))
            wiring[f"{mod}.{fn}"] = "importable" if ok else "not callable"
            if not ok:
                errors.append(f"{mod}.{fn} is not callable")
        except Exception as e:  # reported, not raised: the dry run lists every wiring problem
            wiring[f"{mod}.{fn}"] = f"{type(e).__name__}: {e}"
            errors.append(f"cannot import {mod}.{fn}: {e}")
    if not KERNEL_TEST.exists():
        errors.append(f"{KERNEL_TEST} is missing")
    names = [c.name for c in checks]
    if len(set(names)) != len(names):
        errors.append(f"duplicate check names: {names}")
    work = Path(tempfile.gettempdir()) / "gpu_validate-dry-run"
    records = []
    for c in checks:
        ctx = Context(work=work / c.name, env={}, engine_flags=engine_flags)
        try:
            commands = c.plan(ctx)
        except Exception as e:
            commands = []
            errors.append(f"{c.name}: plan raised {type(e).__name__}: {e}")
        if not commands:
            errors.append(f"{c.name}: no planned command")
        rec = {"name": c.name, "title": c.title, "status": PLANNED, "timeout_s": c.timeout_s, "commands": commands}
        if c.expected:
            rec["expected"] = c.expected
        records.append(rec)
        print(f"[{PLANNED}] {c.name} (timeout {c.timeout_s:.0f} s): {c.title}")
        for cmd in commands:
            print(f"    {cmd}")
    total = sum(c.timeout_s for c in checks)
    summary = {"script": "benchmarks/gpu_validate.py", "mode": "dry-run", "budget_s": budget_s,
               "budget_two_gpus_s": budget_for(checks, 2), "timeouts_total_s": total, "engine_flags": engine_flags, "python": sys.executable,
               "wiring": wiring, "errors": errors, "checks": records, "ok": not errors}
    path = _write_summary(out, summary)
    print(f"dry run: {len(records)} checks planned, timeouts sum {total:.0f} s (budget {budget_s:.0f} s); "
          f"{'wiring OK' if not errors else 'wiring errors: ' + '; '.join(errors)}; summary {path}")
    return summary, 0 if not errors else 1


def budget_for(checks: Sequence[Check], gpus: int) -> float:
    """The run's default budget: the timeouts of the checks a machine with ``gpus`` GPUs runs (390 s on one GPU, where
    the two-GPU checks skip at once; 570 s with two)."""
    return sum(c.timeout_s for c in checks if c.gpus <= max(gpus, 1))


def run_all_checks(checks: tuple[Check, ...], out: Path, work: Path, engine_flags: list[str],
                   budget_s: float | None, python: str = sys.executable) -> tuple[dict, int]:
    t_start = time.monotonic()
    env = probe_environment(python, timeout_s=min(90.0, (budget_s or MAX_BUDGET_S) / 4))
    budget_s = budget_s or budget_for(checks, int(env.get("device_count", 0)))
    print(f"environment: {json.dumps(env)}", flush=True)
    summary: dict[str, Any] = {"script": "benchmarks/gpu_validate.py", "mode": "run", "budget_s": budget_s,
                               "environment": env, "engine_flags": engine_flags, "work_dir": str(work),
                               "checks": []}
    for c in checks:
        left = budget_s - (time.monotonic() - t_start)
        if left < MIN_START_S:
            rec = {"name": c.name, "title": c.title, "status": SKIP, "seconds": 0.0, "timeout_s": c.timeout_s,
                   "reason": f"out of the run's budget ({left:.0f} s left of {budget_s:.0f} s)", "details": {}}
            if c.expected:
                rec["expected"] = c.expected
        else:
            ctx = Context(work=work / c.name, env=env, engine_flags=engine_flags, python=python)
            rec = run_check(c, ctx, min(c.timeout_s, left - 5.0))
        _print_record(rec)
        summary["checks"].append(rec)
        _finish(summary, t_start)
        _write_summary(out, summary)
    failed = [r["name"] for r in summary["checks"] if r["status"] == FAIL]
    if not summary["counts"][PASS] and not failed:
        print("nothing was validated: every check skipped (see the reasons above)", flush=True)
    print(f"{summary['counts']}; {time.monotonic() - t_start:.0f} s; summary {out / SUMMARY_NAME}"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return summary, 1 if failed else 0


def _finish(summary: dict, t_start: float) -> None:
    counts = {s: sum(r["status"] == s for r in summary["checks"]) for s in (PASS, FAIL, SKIP)}
    summary.update(counts=counts, wall_s=round(time.monotonic() - t_start, 1), ok=counts[FAIL] == 0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="check the wiring and print the plan; start nothing")
    p.add_argument("--out", type=Path, default=None,
                   help=f"where {SUMMARY_NAME} goes (default: $OUT if set, else {DEFAULT_OUT.relative_to(REPO)})")
    p.add_argument("--work-dir", type=Path, default=None, help="server logs and KV stores (default: a new temp dir)")
    p.add_argument("--only", nargs="+", choices=[c.name for c in CHECKS], help="run these checks only")
    p.add_argument("--budget-s", type=float, default=None,
                   help="the whole run's time limit in seconds (default: the timeouts of the checks this machine "
                        f"runs: {budget_for(CHECKS, 1):.0f} on one GPU, {budget_for(CHECKS, 2):.0f} with two)")
    p.add_argument("--engine-flags", default=ENGINE_FLAGS, help="SGLang flags of every instance (one string)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else DEFAULT_OUT)
    checks = tuple(c for c in CHECKS if not args.only or c.name in args.only)
    flags = shlex.split(args.engine_flags)
    if args.dry_run:
        return dry_run(checks, out, flags, args.budget_s or budget_for(checks, 1))[1]
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpu_validate-"))
    return run_all_checks(checks, out, work, flags, args.budget_s)[1]


if __name__ == "__main__":
    sys.exit(main())
