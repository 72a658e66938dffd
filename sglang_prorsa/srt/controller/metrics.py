"""Merge Prometheus exposition texts from several processes into one: each sample labelled with the instance it
came from (unless it has one), and each metric's ``# HELP``/``# TYPE`` lines kept once."""

from __future__ import annotations

import re

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?(\s.*)$")


def merge_prometheus(text: str, instance: str | None) -> str:
    seen_meta: set[tuple[str, str]] = set()
    out: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            key = (parts[1], parts[2]) if len(parts) >= 3 else (line, "")
            if key in seen_meta:
                continue
            seen_meta.add(key)
            out.append(line)
            continue
        m = _SAMPLE.match(line)
        if m is None or instance is None:
            out.append(line)
            continue
        name, labels, rest = m.group(1), m.group(2) or "", m.group(3)
        if 'instance="' in labels:
            out.append(line)
            continue
        inner = labels[1:-1]
        labels = "{" + f'instance="{instance}"' + ("," + inner if inner else "") + "}"
        out.append(f"{name}{labels}{rest}")
    return "\n".join(out) + "\n"
