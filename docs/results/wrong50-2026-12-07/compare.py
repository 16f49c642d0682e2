"""The expert's wrong-constant recovery in half its warm-start episodes (`warm_start.wrong_edit=0.5`,
arm `grpo+errcost+wrong50`) against the default's 0.15 (`grpo+errcost+eval48`, the runs of
fresh-seeds4), on seeds 26 and 27 (two of fresh-seeds4's misses, chosen after seeing them: a probe,
not a test). Both arms: their own warm start, the default's RL, the same 48 held-out repos, tasks and
random numbers. Per seed: each arm's warm start and after-RL pass@1, and wrong50 - default paired
over tasks at both. Run from the repository root:
    .venv/bin/python docs/results/wrong50-2026-12-07/compare.py
"""
import json
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference

HERE = Path(__file__).parent
DEFAULT = HERE.parent / "fresh-seeds4-eval48-2026-12-07"


def evals(run: Path) -> tuple[dict, dict]:
    paths = sorted((run / "eval").glob("step*.json"))
    return json.loads(paths[0].read_text()), json.loads(paths[-1].read_text())


print("| seed | default: warm -> RL | wrong50: warm -> RL | warm: wrong50 - default ± s.e. (tasks differing) | after RL: wrong50 - default ± s.e. | z |")
print("|---|---|---|---|---|---|")
for seed in (26, 27):
    (dw, dr), (ww, wr) = evals(DEFAULT / f"seed{seed}_grpo+errcost+eval48"), evals(HERE / f"seed{seed}_grpo+errcost+wrong50")
    warm, rl = paired_difference(dw, ww), paired_difference(dr, wr)
    se_warm, se_rl = over_tasks(warm).se_paired, over_tasks(rl).se_paired
    print(f"| {seed} | {warm.pass_a:.3f} -> {rl.pass_a:.3f} | {warm.pass_b:.3f} -> {rl.pass_b:.3f} | "
          f"{warm.diff:+.3f} ± {se_warm:.3f} ({warm.tasks_better} better, {warm.tasks_worse} worse) | "
          f"{rl.diff:+.3f} ± {se_rl:.3f} | {rl.diff / se_rl:.1f} |")
