"""The `carl` command's groups, one module each, registered by carl/cli.py: the application on top
of every library package. Each defines `register(subparsers)` and imports nothing heavy at module
level, so `carl --help` stays fast and torch is only imported by the commands that train.

    demo.py         `carl demo`: the scripted expert on a generated micro task
    sandbox.py      `carl sandbox run`: one command in a fresh sandbox
    env.py          `carl env serve`: the HTTP environment server
    agent.py        `carl agent run`: one agent episode, transcript shown live (and --policy specs)
    tasks.py        `carl tasks build|validate|stats|show`
    train.py        `carl train`
    eval.py         `carl eval` (and the policy/limits set-up `carl bench run` shares)
    bench.py        `carl bench ...`; bench_build.py its `build`
    engine.py       `carl engine setup|serve`
    online.py       `carl serve` and `carl online`
    midtrain.py     `carl midtrain`

No library package imports this one (tests/test_layering.py), so the packages' import graph has
no cycle through the commands.
"""
