"""What the processes share: typed messages and error codes, the instance registry model, the channel between an
instance's two processes, HTTP helpers, API keys, the declaration of every SGLang internal we touch, the cache
root (``paths``) and the version pins (``pins``). Everything else in ``srt`` may import this package; it imports
none of them."""
