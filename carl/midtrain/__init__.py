"""`carl midtrain`: continued pretraining of a causal LM on a team's repositories (docs/midtrain.md;
the command is carl.commands.midtrain).

    config.py   the run's frozen config dataclasses (TOML + dotted overrides)
    data.py     collect files from sources, filter (vendored, generated, binary, huge), deduplicate,
                split by file into train and held-out
    packing.py  tokenize, add general data to its share, pack into fixed-length rows, save/load
    step.py     the train step and the held-out evaluation (per-file losses), on 1 or N ranks
    loop.py     the main loop: data, model, resume, steps, evals, checkpoints, plots
"""
