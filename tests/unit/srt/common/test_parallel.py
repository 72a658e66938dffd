"""An instance's DP layout from SGLang's arguments, for both spellings of attention DP, before SGLang resolves them
(parsed by SGLang 0.5.23's own parser, as the launcher sees them) and after (as the spawned schedulers see them:
``--dp-size N --enable-dp-attention`` becomes ``attn_dp_size = N, dp_size = 1``, the flag cleared)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from sglang_prorsa.srt.common.gpus import instance_gpus
from sglang_prorsa.srt.common.parallel import attention_dp, attention_groups, dp_ranks, replicas, scheduler_processes


def _parsed(flags: list[str]):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(["--model-path", "/nonexistent", "--device", "cpu", *flags]))


# (flags, attention DP, attention groups, replicas, DP ranks = channels, scheduler processes = GPUs)
CASES = [
    ([], False, 1, 1, 1, 1),
    (["--tp-size", "2"], False, 1, 1, 1, 2),
    (["--tp-size", "2", "--dp-size", "2"], False, 1, 2, 2, 4),
    (["--tp-size", "4", "--attn-dp-size", "2"], True, 2, 1, 2, 4),
    (["--tp-size", "4", "--dp-size", "4", "--enable-dp-attention"], True, 4, 1, 4, 4),
]


@pytest.mark.parametrize("flags,on,groups,reps,ranks,procs", CASES)
def test_the_layout_as_sglangs_parser_gives_it(flags, on, groups, reps, ranks, procs):
    args = _parsed(flags)
    assert (attention_dp(args), attention_groups(args), replicas(args), dp_ranks(args),
            scheduler_processes(args), instance_gpus(args)) == (on, groups, reps, ranks, procs, procs)


def test_the_deprecated_spelling_gives_the_same_layout_after_sglang_resolves_it():
    before = SimpleNamespace(tp_size=4, pp_size=1, dp_size=4, attn_dp_size=1, enable_dp_attention=True)
    after = SimpleNamespace(tp_size=4, pp_size=1, dp_size=1, attn_dp_size=4, enable_dp_attention=False)
    for f in (attention_dp, attention_groups, replicas, dp_ranks, scheduler_processes):
        assert f(before) == f(after), f.__name__
    assert dp_ranks(after) == 4 and scheduler_processes(after) == 4


@pytest.mark.parametrize("flags", [["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"],
                                   ["--tp-size", "2", "--attn-dp-size", "2"]])
def test_the_layout_after_sglangs_own_resolution(flags):
    """SGLang's launcher resolves the record before it spawns the schedulers (``resolve_once``). Its resolved view turns
    the deprecated spelling into ``attn_dp_size`` (``dp_size`` 1, the flag cleared), while the record's attributes keep
    what was given: the layout must read the same from either."""
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.server_args import prepare_server_args

    from sglang_prorsa.testing.tiny_moe import ensure_moe_model

    args = prepare_server_args(["--model-path", str(ensure_moe_model()), "--device", "cpu", *flags])
    args.resolve_once()
    view = resolving_view(args)
    assert (view.enable_dp_attention, view.dp_size, view.attn_dp_size) == (False, 1, 2)
    for record in (args, view):
        assert (attention_dp(record), dp_ranks(record), scheduler_processes(record)) == (True, 2, 2)
