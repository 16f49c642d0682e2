"""Feature-deletion tasks: break a real repository, ask the agent to rebuild it (DESIGN 1.3).

Public API: TaskRecord, load_tasks, write_tasks, append_task, broken_repo_dir,
original_repo_dir, sandbox_config_for. The pipeline itself is `carl.tasks.build.build_repo`.
This package never imports torch.
"""

from carl.tasks.record import TaskRecord
from carl.tasks.store import (
    append_task,
    broken_repo_dir,
    load_tasks,
    original_repo_dir,
    sandbox_config_for,
    write_tasks,
)

__all__ = [
    "TaskRecord",
    "append_task",
    "broken_repo_dir",
    "load_tasks",
    "original_repo_dir",
    "sandbox_config_for",
    "write_tasks",
]
