"""The GPU validation pack's time budget (tests/gpu/run.sh), checked without a
GPU: a GPU machine is lent for minutes, so the pack's worst case (every step
running to its hard limit) must stay within 8 minutes, and --smoke within 3.
Every step run.sh runs must take its limit from the STEPS table, so that
adding the table up is adding up the run."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN_SH = REPO / "tests/gpu/run.sh"

FULL_LIMIT_S = 8 * 60
SMOKE_LIMIT_S = 3 * 60
# What timeout's -k adds after the limit, per step that uses it.
KILL_GRACE_S = 2


def steps() -> list[tuple[str, int, bool]]:
    text = RUN_SH.read_text()
    table = re.search(r"^STEPS=\(\n(.*?)^\)", text, re.S | re.M)
    assert table, "run.sh has no STEPS=( ... ) table"
    rows = re.findall(r'^\s*"(\w+)\s+(\d+)\s+(yes|no)"\s*$', table.group(1), re.M)
    assert rows, "the STEPS table has no rows"
    return [(name, int(secs), smoke == "yes") for name, secs, smoke in rows]


def test_worst_case_is_at_most_eight_minutes() -> None:
    total = sum(secs + KILL_GRACE_S for _, secs, _ in steps())
    assert total <= FULL_LIMIT_S, f"run.sh's limits add up to {total} s"


def test_smoke_worst_case_is_at_most_three_minutes() -> None:
    total = sum(secs + KILL_GRACE_S for _, secs, smoke in steps() if smoke)
    assert total <= SMOKE_LIMIT_S, f"run.sh --smoke's limits add up to {total} s"


def test_smoke_runs_the_preflight_the_validated_configurations_and_the_engine() -> None:
    smoke = {name for name, _, in_smoke in steps() if in_smoke}
    assert {"preflight", "validated", "engine", "replay_seeds"} <= smoke
    assert "fp8_algo" not in smoke and "gpu_bench" not in smoke


def test_every_limit_run_sh_uses_is_in_the_table() -> None:
    names = {name for name, _, _ in steps()}
    text = RUN_SH.read_text()
    used = set(re.findall(r"limit_of (\w+)", text)) | set(
        re.findall(r"^\s*(?:gtest|replay) (\w+) ", text, re.M)
    ) | set(re.findall(r"in_run (\w+)", text))
    assert used, "run.sh takes no limits from its table"
    assert used <= names, f"steps without a limit in STEPS: {sorted(used - names)}"
    # No hard-coded timeout beside the table's: each `timeout` takes its
    # limit from limit_of (the preflight's nvidia-smi calls excepted: 5 s
    # each, inside the preflight's own 10).
    for line in text.splitlines():
        m = re.search(r"\btimeout (?:-k \d+ )?(\S+)", line)
        if m and not line.lstrip().startswith("#"):
            assert m.group(1).startswith('"$(limit_of') or "nvidia-smi" in line, line


def test_the_preflight_fits_its_limit() -> None:
    text = RUN_SH.read_text()
    preflight = dict((n, s) for n, s, _ in steps())["preflight"]
    nvidia_smi = [int(s) for s in re.findall(r"timeout (\d+) nvidia-smi", text)]
    assert sum(nvidia_smi) <= preflight
