"""benchmarks/gpu_validate.py, the prepared GPU validation run, on this machine: its dry run plans all six checks
(the wrapper script included), and its runner records a check that raises, skips or hangs for what it did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from unit_support import BENCHMARKS, load_benchmark

gv = load_benchmark("gpu_validate")

NAMES = ["kernels", "busy_switch", "memory_release", "routed_experts", "tp2", "dp2"]
SERVER_CHECKS = ["busy_switch", "memory_release", "routed_experts", "tp2", "dp2"]


def _check_plan(summary: dict) -> None:
    assert summary["mode"] == "dry-run" and summary["ok"] is True and summary["errors"] == []
    checks = {c["name"]: c for c in summary["checks"]}
    assert list(checks) == NAMES
    for c in checks.values():
        assert c["status"] == "PLANNED" and c["commands"] and c["timeout_s"] > 0
    assert "test_kv_gpu.py" in checks["kernels"]["commands"][0]
    for name in SERVER_CHECKS:
        (front,) = [cmd for cmd in checks[name]["commands"] if "sglang_prorsa.launch_server" in cmd]
        for flag in ("--pd-adaptive --prorsa-instances 3 --prorsa-initial-prefill 1 --prorsa-manual-switch "
                     "--prorsa-min-dwell 0 --prorsa-dwell-switch-costs 0", "--prorsa-kv-store file",
                     "--prorsa-kv-store-path", "--model-path"):
            assert flag in front, (name, flag)
    assert "--enable-return-routed-experts" in checks["routed_experts"]["commands"][0]
    assert "tiny-qwen2moe-" in checks["routed_experts"]["commands"][0]
    assert "--tp-size 2" in " ".join(checks["tp2"]["commands"])
    assert "expected" not in checks["tp2"]  # rank-aware persist is built: a FAIL is a failure
    assert "2 x kv_blocks_persisted" in " ".join(checks["tp2"]["commands"])
    dp2 = " ".join(checks["dp2"]["commands"])
    assert "--tp-size 2 --attn-dp-size 2" in dp2 and "tiny-qwen2moe-" in dp2 and "kv_layout_refused = 0" in dp2
    # one GPU: the two-GPU checks are not budgeted (they skip at once), and the rest fits the 8 minutes
    one_gpu = sum(c["timeout_s"] for n, c in checks.items() if n not in ("tp2", "dp2"))
    assert one_gpu == summary["budget_s"] <= 480
    assert summary["budget_two_gpus_s"] == one_gpu + checks["tp2"]["timeout_s"] + checks["dp2"]["timeout_s"]
    assert all(v == "importable" for v in summary["wiring"].values()), summary["wiring"]


def test_dry_run_plans_every_check_and_writes_the_summary(tmp_path, capsys):
    assert gv.main(["--dry-run", "--out", str(tmp_path)]) == 0
    _check_plan(json.loads((tmp_path / gv.SUMMARY_NAME).read_text()))
    printed = capsys.readouterr().out
    assert all(f"[PLANNED] {n}" in printed for n in NAMES) and "sglang_prorsa.launch_server" in printed


def test_the_wrapper_runs_the_dry_run_and_out_env_is_honoured(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "from-env"))
    r = subprocess.run(["bash", str(BENCHMARKS / "gpu_validate.sh"), "--dry-run"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_plan(json.loads((tmp_path / "from-env" / gv.SUMMARY_NAME).read_text()))
    assert "dry run: 6 checks planned" in (tmp_path / "from-env" / "gpu_validate.log").read_text()


def _ctx(tmp_path: Path, name: str) -> object:
    return gv.Context(work=tmp_path / name, env={"cuda_available": False, "device_count": 0}, engine_flags=[])


def _raises(ctx) -> dict:
    ctx.details["got_this_far"] = True
    raise RuntimeError("the front answered 500")


def _skips(ctx) -> dict:
    ctx.require(cuda=True)
    return {}


def _passes(ctx) -> dict:
    return {"reason": "all identical", "moved": 3}


def _hangs(ctx) -> dict:
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)  # stands for a server the check started
    ctx.track(child.pid)
    (ctx.work / "child.pid").write_text(str(child.pid))
    time.sleep(300)
    return {}


def _plan(ctx) -> list[str]:
    return ["echo planned"]


def test_a_check_that_raises_is_a_fail_with_its_reason(tmp_path):
    rec = gv.run_check(gv.Check("boom", "raises", 30, _raises, _plan), _ctx(tmp_path, "boom"), 30)
    assert rec["status"] == "FAIL" and rec["reason"] == "RuntimeError: the front answered 500"
    assert rec["details"] == {"got_this_far": True} and "RuntimeError" in rec["traceback"]


def test_skip_and_pass_are_recorded_with_reason_and_details(tmp_path):
    skip = gv.run_check(gv.Check("s", "skips", 30, _skips, _plan), _ctx(tmp_path, "s"), 30)
    assert skip["status"] == "SKIP" and "no CUDA device" in skip["reason"]
    ok = gv.run_check(gv.Check("p", "passes", 30, _passes, _plan, expected="x"), _ctx(tmp_path, "p"), 30)
    assert ok["status"] == "PASS" and ok["reason"] == "all identical" and ok["details"] == {"moved": 3}
    assert ok["expected"] == "x" and ok["seconds"] < 30


def test_a_hanging_check_is_killed_at_its_timeout_with_what_it_started(tmp_path):
    t0 = time.monotonic()
    rec = gv.run_check(gv.Check("hang", "hangs", 2, _hangs, _plan), _ctx(tmp_path, "hang"), 2)
    assert time.monotonic() - t0 < 30
    assert rec["status"] == "FAIL" and rec["reason"].startswith("timed out after 2 s")
    pid = int((tmp_path / "hang" / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.killpg(pid, signal.SIGKILL)
        pytest.fail("the tracked process outlived the killed check")


def test_the_run_writes_the_summary_fails_on_a_fail_and_skips_past_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(gv, "probe_environment", lambda python, timeout_s=90.0: {"cuda_available": False})
    checks = (gv.Check("p", "passes", 30, _passes, _plan), gv.Check("boom", "raises", 30, _raises, _plan),
              gv.Check("s", "skips", 30, _skips, _plan))
    summary, rc = gv.run_all_checks(checks, tmp_path / "out", tmp_path / "work", [], budget_s=600)
    assert rc == 1 and summary["counts"] == {"PASS": 1, "FAIL": 1, "SKIP": 1} and summary["ok"] is False
    on_disk = json.loads((tmp_path / "out" / gv.SUMMARY_NAME).read_text())
    assert [c["status"] for c in on_disk["checks"]] == ["PASS", "FAIL", "SKIP"]
    summary, rc = gv.run_all_checks(checks[:1], tmp_path / "out2", tmp_path / "work2", [], budget_s=5)
    assert rc == 0 and summary["checks"][0]["status"] == "SKIP" and "budget" in summary["checks"][0]["reason"]


def test_the_default_budget_counts_the_checks_the_machine_can_run(tmp_path, monkeypatch):
    checks = (gv.Check("p", "passes", 30, _passes, _plan), gv.Check("two", "two GPUs", 40, _passes, _plan, gpus=2))
    for gpus, budget in ((1, 30), (2, 70)):
        monkeypatch.setattr(gv, "probe_environment", lambda python, timeout_s=90.0, n=gpus: {"device_count": n})
        summary, rc = gv.run_all_checks(checks, tmp_path / f"out{gpus}", tmp_path / f"work{gpus}", [], None)
        assert rc == 0 and summary["budget_s"] == budget == gv.budget_for(checks, gpus)
