"""The engine extension: what runs in each instance's main process, beside SGLang's tokenizer manager and HTTP server.

It continues requests taken off this instance by a busy switch (at the tokenizer-manager level, where the caller is
still held), runs this instance's side of a switch, and keeps the instance's view of its peers.
"""
