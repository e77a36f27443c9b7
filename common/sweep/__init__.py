"""The `-m` sweep machinery both apps share, and any Hydra app can use: what the launcher and an app agree on
(contract.py: Resources, SweepApp; each app's is its sweep_app.py), the launcher's work (launch.py) and the sweeper
that checks every point first (sweeper.py), its jobs' outcomes (outcomes.py) and the status of a sweep from its
folder (status.py). Hydra finds the launcher and the sweeper as thin plugin classes over launch.py and sweeper.py
(docs/design.md). Light: no torch, no llm-foundry."""
