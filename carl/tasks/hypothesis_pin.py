"""Property-based tests (Hypothesis) made repeatable in carl's pytest runners.

Left alone, a Hypothesis test can pass in one run of a repository and fail in the next:
- it draws fresh random examples every run;
- it saves the failing examples it found in a database under the workspace and replays them
  first in the next run;
- it fails an example that ran longer than the test's deadline (200 ms by default; a repository's
  profile or the test's own settings may set another), and a test whose data took too long to
  generate (the `too_slow` health check): on a loaded machine, such as an RL run with many
  sandboxes at once, a correct repository fails.
Measured: attrs 26.1.0's cluster task `Factory.__getstate__ + Factory.__setstate__` was dropped
as nondeterministic in 1 of 3 builds of the same lock beside a training run, because
`TestFieldsDict::test_instance` (a `@given` test under attrs' 400 ms deadline) changed outcome
between its two validation runs; the same flip in a reward turns a right answer into reward 0.

`pin_hypothesis(items)` runs in both runners after collection (validation's recorder,
carl.tasks.suite, and the reward's runner, carl/rewards/sandboxed_pytest.py): every Hypothesis
test gets its settings with `derandomize=True` (its examples come from a hash of the test, the
same in every run, so validation and the reward see the same ones), `database=None`,
`deadline=None` and `too_slow` suppressed; the rest of its settings (max_examples, phases, the
repository's profile) stay. A test pinned with `@seed` keeps its seed. Stateful tests
(`RuleBasedStateMachine.TestCase`) are not changed.

This module is also source text: the runners run inside the sandbox with the standard library,
pytest and the environment's packages only, and embed `SOURCE`.
"""

import inspect
import sys


def pin_hypothesis(items):
    """Pin the settings of the Hypothesis tests among pytest `items`; returns how many were pinned.
    Does nothing where no test module imported hypothesis."""
    if "hypothesis" not in sys.modules:  # no test uses it: importing it would cost every run ~1 s
        return 0
    try:
        from hypothesis import HealthCheck, settings
    except Exception:  # noqa: BLE001 - a broken or shadowed hypothesis: its tests run as they are
        return 0
    pinned = 0
    for item in items:
        test = getattr(item, "obj", None)
        test = getattr(test, "__func__", test)  # a test method: its function holds the settings
        current = getattr(test, "_hypothesis_internal_use_settings", None)
        if not getattr(test, "is_hypothesis_test", False) or current is None:
            continue
        suppress = list(current.suppress_health_check)
        if HealthCheck.too_slow not in suppress:
            suppress.append(HealthCheck.too_slow)
        try:
            test._hypothesis_internal_use_settings = settings(
                current, derandomize=True, database=None, deadline=None, suppress_health_check=suppress)
        except Exception:  # noqa: BLE001 - a version whose settings refuse these: the test runs as it is
            continue
        pinned += 1
    return pinned


SOURCE = inspect.getsource(pin_hypothesis)
"""`pin_hypothesis` as text for a runner to embed (it needs `sys` imported there)."""
