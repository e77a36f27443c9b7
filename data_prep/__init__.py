"""Raw corpora (JSON lines: C4, SlimPajama, any .jsonl[.gz|.zst]) -> MDS token samples for llm-foundry.

Flow, one direction: compose (Hydra, conf/data_prep.yaml) -> validate (settings.py) -> plan blocks and
parts (blocks.py) -> each part reads, tokenizes and writes MDS per block (part.py) -> merge (merge.py).
"""
