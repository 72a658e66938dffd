"""An in-process engine started the way verl 0.9.1 starts one, with our ``Engine`` in place of SGLang's (the one
import a verl user changes): verl's ``SGLangHttpServer.launch_server`` calls ``Engine._launch_subprocesses`` with
SGLang's three process functions, sets SGLang's HTTP globals, and serves SGLang's ``app`` with its own uvicorn on the
loop where it then calls ``tokenizer_manager.generate_request`` in-process
(verl/workers/rollout/sglang_rollout/async_sglang_server.py). Our settings go through ``Engine.with_options``.

    python -m verl_engine --front URL --kv-store-path DIR --instance-id ID -- SGLANG FLAGS...

It registers with the front's controller by itself (``controller_url``) and adds one route for the test,
``POST /verl/group``: one GRPO group run in this process by our verl agent loop, every model turn an in-process
``generate_request`` built as verl's ``SGLangHttpServer.generate`` builds it (a whole request: the engine pairs it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import uvicorn


def server_args_from(flags: list[str]):
    from sglang.srt.server_args import prepare_server_args

    from sglang_prorsa.srt import cpu_recipe
    from sglang_prorsa.testing.tiny_model import ensure_default_model

    if not cpu_recipe.given(flags, "--model-path"):
        flags += ["--model-path", str(ensure_default_model()), "--dtype", "float32"]
    if not cpu_recipe.cuda_available():
        flags = cpu_recipe.apply_cpu_flags(flags)
        os.environ.update(cpu_recipe.cpu_environment(dict(os.environ)))
    return prepare_server_args(flags)


def group_route(app, tm, front: str) -> None:
    """``POST /verl/group {prompt, turns, group, tool_s, task}``: one GRPO group of ``group`` episodes through
    ``sglang_prorsa.integrations.verl.ProrsaAgentLoop`` around a tool agent loop shaped as verl's, generating
    through a server manager that calls this process's tokenizer manager as verl's ``SGLangHttpServer.generate``
    does (a whole request: the engine pairs it). Hints go to the front. Answers each episode's model turns."""
    from sglang_prorsa.testing.verl_shapes import InProcessServerManager, run_group

    @app.post("/verl/group")
    async def verl_group(body: dict[str, Any]) -> dict:
        episodes = await run_group(None, InProcessServerManager(tm), None, body["prompt"], body["group"],
                                   tool_s=body.get("tool_s", 0.5), front_url=front, turn_tokens=body["turns"],
                                   tool_result=[7, 11, 13, 17], uid=f"task{body['task']}",
                                   sampling_params={"temperature": 0, "ignore_eos": True})
        return {"outputs": [e.turns for e in episodes], "trajectories": [e.trajectory_id for e in episodes]}


async def serve(args: argparse.Namespace, flags: list[str]) -> None:
    import sglang.srt.entrypoints.engine
    from sglang.srt.entrypoints.http_server import _GlobalState, app, set_global_state
    from sglang.srt.managers.tokenizer_manager import ServerStatus

    from sglang_prorsa.engine import Engine

    server_args = server_args_from(flags)
    engine_class = Engine.with_options(controller_url=args.front, instance_id=args.instance_id, kv_store="file",
                                       kv_store_path=args.kv_store_path, cpu_threads=args.cpu_threads)
    # verl's call (SGLangHttpServer.launch_server), our class in place of SGLang's
    tm, template_manager, _port_args, scheduler_init_result, *_ = engine_class._launch_subprocesses(
        server_args=server_args,
        init_tokenizer_manager_func=sglang.srt.entrypoints.engine.init_tokenizer_manager,
        run_scheduler_process_func=sglang.srt.entrypoints.engine.run_scheduler_process,
        run_detokenizer_process_func=sglang.srt.entrypoints.engine.run_detokenizer_process,
    )
    set_global_state(_GlobalState(tokenizer_manager=tm, template_manager=template_manager,
                                  scheduler_info=scheduler_init_result.scheduler_infos[0]))
    app.is_single_tokenizer_mode = True
    app.server_args = server_args
    app.warmup_thread_kwargs = {"server_args": server_args}
    group_route(app, tm, args.front)
    server = uvicorn.Server(uvicorn.Config(app, host=server_args.host, port=server_args.port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    tm.server_status = ServerStatus.Up
    print(f"verl_engine: serving {server_args.url()}", flush=True)
    await task


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="verl_engine")
    parser.add_argument("--front", required=True)
    parser.add_argument("--kv-store-path", required=True)
    parser.add_argument("--instance-id", required=True)
    parser.add_argument("--cpu-threads", type=int, default=0)
    ours, flags = parser.parse_known_args(argv)
    try:
        asyncio.run(serve(ours, [f for f in flags if f != "--"]))
    finally:
        from sglang.srt.utils import kill_process_tree

        kill_process_tree(os.getpid(), include_parent=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
