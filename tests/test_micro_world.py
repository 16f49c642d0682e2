"""The micro world's build: repos in parallel give the same world, a failed repo stops the build."""

import json

import pytest

import carl.micro.world as world_mod
from carl.micro.world import build_micro_tasks

pytestmark = pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
REPOS = {"warm_start": 2, "rl": 1, "eval": 1}


def _records(out, split):
    """The split's task records, sorted, without what differs between two builds of the same tasks
    (creation time, measured test timings, the build's own directory)."""
    rows = [json.loads(line) for line in (out / f"{split}.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("created_at")
        r.pop("test_timings")
    return json.dumps(sorted(rows, key=lambda r: r["instance_id"])).replace(str(out), "OUT")


def test_repos_built_in_parallel_give_the_same_world_as_one_at_a_time(tmp_path):
    built = {}
    for jobs in (1, 3):
        out = tmp_path / f"jobs{jobs}"
        seen = []
        world = build_micro_tasks(out, seed=0, difficulty=4, repos=REPOS, max_tasks_per_repo=2, backend="local",
                                  progress=lambda split, s, r: seen.append((split, s, r is not None)), jobs=jobs)
        assert sorted(seen) == sorted((split, s, True) for split, n in REPOS.items()
                                      for s in world_mod.split_seeds(split, 0, n))
        assert all(world[split] for split in REPOS)
        built[jobs] = out
    for split in REPOS:
        assert _records(built[1], split) == _records(built[3], split)

    seen = []  # a rerun builds nothing and reports every repo as built before
    again = build_micro_tasks(built[3], seed=0, difficulty=4, repos=REPOS, max_tasks_per_repo=2, backend="local",
                              progress=lambda split, s, r: seen.append(r), jobs=3)
    assert seen == [None] * sum(REPOS.values())
    assert {k: [t.instance_id for t in v] for k, v in again.items()} == \
        {k: [t.instance_id for t in v] for k, v in world.items()}


def test_a_repo_that_gives_no_tasks_stops_the_build_and_names_the_repo(tmp_path, monkeypatch):
    real = world_mod.build_repo
    started = []

    def build_repo(spec, out, cfg, **kw):
        started.append(spec)
        result = real(spec, out, cfg, **kw)
        if spec.endswith("repo1"):  # the second warm-start repo
            result.status, result.error = "failed", "RepoFailure: no test passed twice"
        return result

    monkeypatch.setattr(world_mod, "build_repo", build_repo)
    with pytest.raises(RuntimeError, match=r"micro repo .*repo1 gave no tasks: RepoFailure: no test passed twice"):
        build_micro_tasks(tmp_path, seed=0, difficulty=4, repos={"warm_start": 8}, max_tasks_per_repo=1,
                          backend="local", jobs=2)
    assert len(started) < 8  # the repos not yet started were cancelled


def test_a_negative_number_of_jobs_is_refused(tmp_path):
    with pytest.raises(ValueError, match="jobs: got -1"):
        build_micro_tasks(tmp_path, seed=0, difficulty=4, repos={"eval": 1}, jobs=-1)


def test_keep_templates_cuts_rl_and_eval_to_the_named_templates_and_writes_them(tmp_path):
    from carl.micro.world import keep_templates, template
    from carl.tasks import TaskRecord, load_tasks

    def task(i: str, name: str) -> TaskRecord:
        return TaskRecord(instance_id=i, repo=i[:2], deleted_symbols=(f"pkg.rules:{name}",))

    assert template(task("r1__0", "clamp_all_price")) == "clamp_all"
    assert template(TaskRecord(instance_id="m", repo="m", deleted_symbols=("pkg.mod:Meter.reset_total",))) == "reset"
    world = {"warm_start": [task("w1__0", "clamp_price")],
             "rl": [task("r1__0", "shift_price"), task("r1__1", "clamp_price"), task("r2__0", "scale_level")],
             "eval": [task("h1__0", "scale_name"), task("h1__1", "tag_name"), task("h2__0", "shift_label")]}
    kept = keep_templates(world, ["shift", "scale"], tmp_path)
    assert kept["warm_start"] == world["warm_start"]  # the warm start keeps every template
    assert [t.instance_id for t in kept["rl"]] == ["r1__0", "r2__0"]
    assert [t.instance_id for t in kept["eval"]] == ["h1__0", "h2__0"]
    assert [t.instance_id for t in load_tasks(tmp_path / "eval.templates.jsonl")] == ["h1__0", "h2__0"]
    with pytest.raises(ValueError, match=r"\['tag'\] match no rl task of this world; its rl tasks' templates are "
                                         r"\['clamp', 'scale', 'shift'\]"):
        keep_templates(world, ["shift", "tag"], tmp_path)


def test_a_split_cut_to_templates_validates_only_theirs_and_keeps_the_same_tasks(tmp_path):
    """Built with `templates`, a split holds exactly the tasks keep_templates cuts from a full build
    of the same repos, and the other templates' candidates were never validated."""
    from carl.micro.world import keep_templates, template

    repos = {"rl": 2, "eval": 2}
    results = {}
    full = build_micro_tasks(tmp_path / "full", seed=3, difficulty=4, repos=repos, max_tasks_per_repo=3,
                             backend="local", jobs=2)
    names = sorted({template(t) for t in full["rl"]} & {template(t) for t in full["eval"]})
    assert names and any(template(t) not in names[:1] for split in repos for t in full[split])
    keep = names[:1]  # a template both splits have; the others' tasks are what the cut drops
    cut = keep_templates(full, keep, tmp_path / "full")
    built = build_micro_tasks(tmp_path / "cut", seed=3, difficulty=4, repos=repos, max_tasks_per_repo=3,
                              backend="local", jobs=2, templates={split: keep for split in repos},
                              progress=lambda split, s, r: results.setdefault(split, []).append(r))
    for split in repos:
        assert [t.instance_id for t in built[split]] == [t.instance_id for t in cut[split]]
        assert sum(r.n_attempts for r in results[split]) == len(cut[split])  # validated: the kept tasks only
        assert sum(r.n_unused for r in results[split]) == len(full[split]) - len(cut[split])


def test_templates_that_no_task_of_a_split_has_are_named(tmp_path):
    from carl.errors import UserError

    with pytest.raises(UserError, match=r"micro.templates: \['nosuch'\] match no rl task of the 1 rl repos"):
        build_micro_tasks(tmp_path, seed=0, difficulty=4, repos={"rl": 1}, max_tasks_per_repo=2, backend="local",
                          templates={"rl": ["nosuch"]})
