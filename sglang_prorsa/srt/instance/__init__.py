"""One engine instance's entry (``python -m sglang_prorsa.srt.instance --spec FILE``): apply the overrides
(``overrides.py``, the one place SGLang's behaviour is changed), then run SGLang's server with the engine extension
(``srt/engine``) in its main process and the scheduler extension (``srt/scheduler``) in its scheduler process."""
