"""Stage 1, compose: the config groups in conf/ -> one config. Resolvers, typed schemas of our groups, what a run
*is* (its identity and name), and composing outside a plain `python -m train` (sweep points, tests, benchmarks).
Light: no torch, no llm-foundry.
"""
