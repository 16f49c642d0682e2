"""What the model wrote in failed held-out episodes whose first test run failed (seeds 30-34, the
warm start at step 0 and after RL at step 5): is the first edit's body copied from the file it read (each
line of it stands elsewhere in that file, e.g. a neighbour's `return WEIGHT_TAG + s` in
`scale_weight`), or something else? Looked for after the fact, on seed 30's transcripts.

Reads the transcripts `carl train` writes (not kept: 10-15 kB each), writes one line per such
episode to wrong_edits.jsonl and prints the counts (wrong_edits.txt). Run from the repository root:
    .venv/bin/python docs/results/fresh-seeds5-expert-words-2026-12-07/wrong_edits.py runs/learning-fresh5
Recount from the kept lines alone: wrong_edits.py --from-jsonl.
"""
import collections
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
SEEDS = (30, 31, 32, 33, 34)


def unboxed(text: str) -> str:
    """The transcript without its box drawing: `│ text │` lines back to `text`."""
    return "\n".join(re.sub(r"\s*│$", "", line[2:]) if line.startswith("│ ") else line for line in text.splitlines())


def first_edit(text: str) -> dict | None:
    plain = unboxed(text)
    runs = re.findall(r"^Tests: (.*)$", plain, re.M)
    if not runs or not re.search(r"failed|error", runs[0]):
        return None
    edit = re.search(r'<tool\s+name="edit_file">.*?<new>(.*?)</new>', plain, re.S)
    before = plain[:edit.start()] if edit else plain  # what read_file showed before the edit (not its echo)
    file_lines = {m.group(1).strip() for m in re.finditer(r"^\s+\d+  (.*)$", before, re.M)}
    if edit is None:
        kind, body = "no edit_file with a <new>", ""
    else:
        body = edit.group(1).strip("\n")
        lines = [ln.strip() for ln in body.splitlines() if ln.strip()]
        if not file_lines:
            kind = "the file was not read"
        elif lines and all(ln in file_lines for ln in lines):
            kind = "every line copied from the file read"
        else:
            kind = "other"
    return {"kind": kind, "body": body}


def main() -> None:
    if sys.argv[1:] == ["--from-jsonl"]:
        rows = [json.loads(line) for line in (HERE / "wrong_edits.jsonl").read_text().splitlines()]
    else:
        rows = []
        for seed in SEEDS:
            for path in sorted((Path(sys.argv[1]) / f"seed{seed}_grpo+errcost+eval48" / "transcripts").glob(
                    "step0000[05]_eval_*_fail_*.txt")):
                row = first_edit(path.read_text())
                if row is not None:
                    rows.append({"seed": seed, "step": int(path.name[4:9]), "episode": path.name, **row})
        (HERE / "wrong_edits.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = collections.Counter((r["step"], r["kind"]) for r in rows)
    kinds = sorted({r["kind"] for r in rows})
    print("failed held-out episodes whose first test run failed, by their first edit's body")
    for step in (0, 5):
        n = sum(counts[(step, k)] for k in kinds)
        print(f"step {step} ({n} episodes): " + "; ".join(f"{k} {counts[(step, k)]}" for k in kinds))


main()
