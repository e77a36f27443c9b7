"""Our composed config -> the DictConfig that llm-foundry's train() takes."""
from omegaconf import DictConfig, OmegaConf

from train.checks.values import PRODUCT_KEYS


def foundry_config(cfg: DictConfig) -> DictConfig:
    """Resolve every interpolation (ours included) and keep only llm-foundry's keys.

    Resolving here, while Hydra's context is live, is what lets `${hydra:...}` and our resolvers appear in
    the config: llm-foundry resolves again and must find plain values.
    """
    from train.config.hf_arch import foundry_model, is_hf
    from train.config.vocab import special_ids

    plain = OmegaConf.to_container(cfg, resolve=True)
    if is_hf(plain.get("model")):  # a Hugging Face model: our groups' MPT knobs in its own terms
        plain["model"] = foundry_model(plain["model"], special_ids((plain.get("tokenizer") or {}).get("name") or ""))
    return OmegaConf.create({k: v for k, v in plain.items() if k not in PRODUCT_KEYS and k != "hydra"})
