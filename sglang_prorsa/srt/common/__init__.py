"""What the processes share: typed messages and error codes, the instance registry model, the channel between an
instance's two processes, HTTP helpers, API keys, and the declaration of every SGLang internal we touch. Everything
else in ``srt`` may import this package; it imports none of them."""
