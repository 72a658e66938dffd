"""The paper's numbers the simulator's code uses (benchmarks/paper_numbers.json keeps every number with its quote).

No imports: the grid report reads these without loading the simulator.
"""

# §5.4 (Figure 7): the best static prefill:decode instance ratios for MiMo-V2.5-Pro on 8 instances, per task.
PAPER_OPTIMA: dict[str, tuple[int, int]] = {"math": (4, 4), "coding_agent": (5, 3), "general_agent": (3, 5)}


def paper_optima_text() -> str:
    """``math 4:4, coding 5:3, general 3:5``."""
    return ", ".join(f"{task.split('_')[0]} {p}:{d}" for task, (p, d) in PAPER_OPTIMA.items())
