"""What runs inside SGLang's scheduler process: our extension of the scheduler (busy switch, prefix load, counters)."""
