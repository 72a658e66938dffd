"""``Engine``: SGLang's in-process engine with the engine extension, for frameworks that run SGLang in their own
process (verl's ``SGLangHttpServer``, AReaL's ``areal_launch_server``) or construct ``sglang.Engine(...)``.

Both frameworks call ``Engine._launch_subprocesses(server_args=..., init_tokenizer_manager_func=...,
run_scheduler_process_func=..., run_detokenizer_process_func=...)`` and then serve SGLang's ``http_server.app``
with their own uvicorn, calling ``tokenizer_manager.generate_request`` in-process beside it. Changing the import to
this class installs the extension at that call (``install.py``): our routes and middleware on SGLang's app, the
engine side on the tokenizer manager the caller's factory makes, our overrides and runtime in each scheduler process
before the caller's scheduler entry runs (AReaL's own entry included). Every generation caller -- HTTP or an
in-process ``generate_request`` -- is then taken off, resumed and stitched the same way when the instance switches.

Our settings are class-level, since the frameworks call the classmethod without them: ``Engine.with_options(...)``
gives a subclass with them (the keywords of ``launch_server``). ``Engine(**kwargs)`` takes them as keywords beside
SGLang's own. Where the instance is reachable (``advertise_url``, else SGLang's ``host:port``) is what it registers
with ``controller_url`` -- once its own ``/health`` answers, i.e. once the caller serves the app -- or what the caller
posts to the front's ``POST /workers``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from sglang.srt.entrypoints.engine import Engine as SGLangEngine

from sglang_prorsa.launch_server import instance_config, prepare_in_process, spec_of


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """Our settings of one in-process instance: ``launch_server``'s keywords, with the same meaning."""

    controller_url: str | None = None
    instance_id: str | None = None
    advertise_url: str | None = None
    kv_store: str = "file"
    kv_store_path: str = ""
    mooncake_master: str = ""
    cpu_threads: int = 0
    switchable: bool = True

    def config(self):
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "switchable"}
        return instance_config(**fields)


_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(EngineOptions))
INSTALLED: Any = None  # install.Installed of this process, once launched (one instance per process)


class Engine(SGLangEngine):
    """``sglang.Engine`` with the engine extension (see the module docstring)."""

    options: ClassVar[EngineOptions] = EngineOptions()

    def __init__(self, **kwargs: Any) -> None:
        ours = {k: kwargs.pop(k) for k in list(kwargs) if k in _OPTION_NAMES}
        if ours:
            # SGLang's __init__ calls the classmethod below without our settings: they travel on the class.
            self.__class__ = type(self).with_options(**ours)
        super().__init__(**kwargs)

    @classmethod
    def with_options(cls, **keywords: Any) -> type[Engine]:
        """A subclass whose launch uses these settings (``EngineOptions``' fields; unknown ones raise TypeError)."""
        options = dataclasses.replace(cls.options, **keywords)
        options.config()  # refuse a bad value now, naming the keyword (ConfigError), not at launch
        return type(cls.__name__, (cls,), {"options": options, "__module__": cls.__module__})

    @classmethod
    def _launch_subprocesses(cls, server_args, init_tokenizer_manager_func, run_scheduler_process_func,
                             run_detokenizer_process_func, port_args=None, placement_group=None):
        """SGLang's launch with the extension installed first, composing with the caller's two process hooks."""
        global INSTALLED
        from sglang.srt.entrypoints import http_server

        from sglang_prorsa.srt.instance.install import install

        config = cls.options.config()
        spec = spec_of(config, server_args, (), switchable=cls.options.switchable)
        prepare_in_process(spec)
        installed = install(spec, server_args, http_server.app)
        INSTALLED = installed
        launched = super()._launch_subprocesses(
            server_args=installed.server_args,
            init_tokenizer_manager_func=installed.tokenizer_manager_factory(init_tokenizer_manager_func),
            run_scheduler_process_func=installed.scheduler_process_entry(run_scheduler_process_func),
            run_detokenizer_process_func=run_detokenizer_process_func, port_args=port_args,
            placement_group=placement_group)
        installed.register_forever(wait_until_serving=True)
        return launched
