"""What the pinned llm-foundry (0.22.0) resolves by name, and the types of its TrainConfig keys, kept here so that
the login node checks them without importing llm-foundry (slow, and torch with it). tests/test_foundry_names.py
(marked `train`: it imports llm-foundry) checks every entry against the library's own registries and dataclass.

OPTIMIZERS / SCHEDULERS: name -> (keyword arguments the class takes, the required ones), or None where it takes
any (**kwargs). llm-foundry itself also reads `disable_grad` and `param_groups` from an optimizer's config.
"""

# What each optimizer takes for a setting its config leaves out (its class's defaults; betas as a list, as a config
# holds them): a resume restores the checkpoint's settings over these, so a key dropped from a YAML is a change.
OPTIMIZER_DEFAULTS = {
    "adalr_lion": {"lr": 0.0001, "betas": [0.9, 0.99], "weight_decay": 0.0, "outlier_threshold": 10.0, "timeout": 100,
                   "lr_penalty": 0.707, "min_scale": 0.0001},
    "clip_lion": {"lr": 0.0001, "betas": [0.9, 0.99], "weight_decay": 0.0, "outlier_threshold": 5.0},
    "decoupled_adamw": {"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-08, "weight_decay": 1e-05, "amsgrad": False},
    "decoupled_lionw": {"lr": 0.0001, "betas": [0.9, 0.99], "weight_decay": 0.0},
    "no_op": {},
}
OPTIMIZERS = {name: (tuple(defaults), ()) for name, defaults in OPTIMIZER_DEFAULTS.items()}
OPTIMIZER_EXTRA = ("disable_grad", "param_groups")  # read by llm-foundry's build_optimizer, not the class

SCHEDULERS = {
    "constant_with_warmup": (("t_warmup", "alpha", "t_max", "scale_warmup"), ("t_warmup",)),
    "cosine_with_warmup": (("t_warmup", "t_max", "alpha_f", "scale_warmup"), ("t_warmup",)),
    "inv_sqrt_with_warmup": None,
    "linear_decay_with_warmup": (("t_warmup", "alpha_i", "alpha_f", "t_max", "scale_warmup"), ("t_warmup",)),
}

# The metrics an `eval_loader` evaluator of an MPT reports, as eval/<Metric> or eval/<label>/<Metric> (the
# model's eval metrics but the in-context learning ones, which only ICL tasks report, by class name), with any of
# `model.additional_train_metrics` beside them.
LM_EVAL_METRICS = ("LanguageCrossEntropy", "LanguagePerplexity", "TokenAccuracy")

DATALOADERS = ("contrastive_pairs", "finetuning", "text")
# What the `text` loader takes besides its name (build_text_dataloader's arguments; llm-foundry passes the tokenizer
# and batch size itself, and pops an evaluator's `label` where there are several): another key is a TypeError.
TEXT_LOADER_KWARGS = (("dataset", "drop_last", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers",
                       "timeout"), ("dataset", "drop_last", "num_workers"))
# What the `text` loader reads of its `dataset:`: the parameters of llm-foundry's StreamingTextDataset and
# streaming's StreamingDataset (it passes those, and silently drops any other key), and the keys its batch-size and
# collator helpers read themselves.
TEXT_DATASET_PARAMS = (
    "allow_unsafe_types", "batch_size", "batching_method", "cache_limit", "download_retry", "download_timeout",
    "epoch_size", "keep_zip", "kwargs", "local", "max_seq_len", "num_canonical_nodes", "partition_algo",
    "predownload", "remote", "replication", "sampling_granularity", "sampling_method", "shuffle", "shuffle_algo",
    "shuffle_block_size", "shuffle_seed", "split", "stream_config", "stream_name", "streams", "token_encoding_type",
    "tokenizer", "validate_hash",
)
# The values streaming takes for a dataset's algorithms: an unknown one fails when the data is first iterated
# (shuffle_algo, partition_algo: a KeyError in its table) or when the dataset is built (sampling_method).
DATASET_CHOICES = {
    "shuffle_algo": ("naive", "py1br", "py1e", "py1s", "py2s"),
    "partition_algo": ("orig", "relaxed"),
    "sampling_method": ("balanced", "fixed"),
}
# composer's get_mixed_precision: one of these names (any case), or a mapping of dtypes; else a ValueError when the
# trainer is built.
MIXED_PRECISION = ("FULL", "DEFAULT", "PURE")
# What an MPT model (`model.name: mpt_causal_lm`) reads of `model:`: MPTConfig's and ComposerMPTCausalLM's
# arguments, and the attributes every transformers PretrainedConfig keeps. MPTConfig takes any other key too, keeps
# it, and nothing reads it: `n_layer: 24` trains the default n_layers.
MPT_MODEL_KEYS = (
    "additional_train_metrics", "attention_bias", "attn_config", "block_overrides", "d_model", "emb_pdrop",
    "embedding_fraction", "expansion_ratio", "fc_type", "ffn_config", "final_logit_softcapping", "head_dim",
    "init_config", "init_device", "learned_pos_emb", "logit_scale", "loss_fn", "max_seq_len", "n_heads", "n_layers",
    "name", "no_bias", "norm_eps", "norm_type", "resid_pdrop", "tie_word_embeddings", "tokenizer",
    "use_cache", "use_pad_tok_in_ffn", "use_train_metrics", "vocab_size",
)
MPT_MODEL_EXTRA = ("master_weights_dtype", "load_in_8bit")  # read by llm-foundry's train command itself
# What a Hugging Face model (`model.name: hf_causal_lm`) takes from `model:`: ComposerHFCausalLM's arguments (but the
# tokenizer, which llm-foundry passes itself); any other key is a TypeError as the model is built.
HF_CAUSAL_LM_KEYS = (
    "additional_eval_metrics", "additional_train_metrics", "allow_embedding_resizing", "attn_implementation",
    "config_overrides", "init_device", "load_in_8bit", "peft_config", "pretrained", "pretrained_lora_id_or_path",
    "pretrained_model_name_or_path", "should_save_peft_only", "trust_remote_code", "use_auth_token",
    "use_flash_attention_2", "use_train_metrics",
)
HF_CONFIG_KEYS = (
    "_attn_implementation_autoset", "_name_or_path", "add_cross_attention", "architectures", "bad_words_ids",
    "begin_suppress_tokens", "bos_token_id", "chunk_size_feed_forward", "cross_attention_hidden_size",
    "decoder_start_token_id", "diversity_penalty", "do_sample", "early_stopping", "encoder_no_repeat_ngram_size",
    "eos_token_id", "exponential_decay_length_penalty", "finetuning_task", "forced_bos_token_id",
    "forced_eos_token_id", "id2label", "is_decoder", "is_encoder_decoder", "label2id", "length_penalty",
    "max_length", "min_length", "model_type", "no_repeat_ngram_size", "num_beam_groups", "num_beams",
    "num_return_sequences", "output_attentions", "output_hidden_states", "output_scores", "pad_token_id", "prefix",
    "problem_type", "pruned_heads", "remove_invalid_values", "repetition_penalty", "return_dict",
    "return_dict_in_generate", "sep_token_id", "suppress_tokens", "task_specific_params", "temperature",
    "tf_legacy_loss", "tie_encoder_decoder", "tie_word_embeddings", "tokenizer_class", "top_k", "top_p",
    "torch_dtype", "torchscript", "transformers_version", "typical_p", "use_bfloat16",
)
TEXT_DATASET_EXTRA = ("eos_token_id", "bos_token_id", "seq_parallel_replication")  # llmfoundry/data/utils.py
CALLBACKS = (
    "early_stopper", "env_logging", "eval_output_logging", "fdiff_metrics", "generate_callback", "global_lr_scaling",
    "hf_checkpointer", "kill_loss_spike", "layer_freezing", "load_checkpoint", "loss_perp_v_len", "lr_monitor",
    "mbmoe_tok_per_expert", "memory_monitor", "memory_snapshot", "mono_checkpoint_saver", "nan_monitor",
    "oom_observer", "optimizer_monitor", "run_timeout", "runtime_estimator", "scheduled_gc", "speed_monitor",
    "system_metrics_monitor",
)
CALLBACKS_WITH_CONFIG = ("async_eval", "curriculum_learning", "dataset_swap")
# Registered by this project when a run starts (train/task/run_report.py, train/task/tracking.py).
OUR_CALLBACKS = ("run_report", "tracking")
ALGORITHMS = ("alibi", "gated_linear_units", "gradient_clipping", "low_precision_layernorm")
LOGGERS = ("in_memory_logger", "inmemory", "mlflow", "mosaicml", "tensorboard", "wandb")
MODELS = ("contrastive_lm", "finetune_embedding_model", "fmapi_causal_lm", "fmapi_chat", "hf_causal_lm", "hf_t5",
          "mpt_causal_lm", "openai_causal_lm", "openai_chat")
ATTENTION_IMPLEMENTATIONS = ("flash", "torch")
ATTENTION_CLASSES = ("grouped_query_attention", "multihead_attention", "multiquery_attention")
NORMS = ("layernorm", "low_precision_layernorm", "low_precision_rmsnorm", "rmsnorm", "triton_rmsnorm")
FFNS = ("mptglu", "mptmlp", "torch_dmoe")
FCS = ("torch",)
# What an MPT block builds from `model.attn_config` and `model.ffn_config`: each attention class and FFN builder
# takes these keyword arguments (as OPTIMIZERS: name -> (arguments, required ones the block does not pass itself),
# or None for **kwargs), and any other key is a TypeError when the model is built, on the cluster. The block keeps
# ATTENTION_CONFIG_EXTRA for itself (blocks.py, args_to_exclude_in_attn_class); build_ffn drops ffn_type.
_ATTENTION = ("attention_bias", "attn_impl", "attn_logit_softcapping", "attn_pdrop", "attn_temperature_tuning", "bias",
              "clip_qkv", "d_model", "device", "fc_type", "fused_qkv", "head_dim", "kv_dim")
_ATTENTION_TAIL = ("n_heads", "nope", "norm_eps", "norm_type", "qk_gn", "qk_ln", "reuse_kv_layer_idx",
                   "reuse_kv_x_layer_idx", "sliding_window_size", "softmax_scale")
ATTENTION_KWARGS = {
    "grouped_query_attention": ((*_ATTENTION, "kv_n_heads", *_ATTENTION_TAIL), ("kv_n_heads",)),
    "multihead_attention": ((*_ATTENTION, *_ATTENTION_TAIL), ()),
    "multiquery_attention": ((*_ATTENTION, *_ATTENTION_TAIL), ()),
}
ATTENTION_CONFIG_EXTRA = ("alibi", "alibi_bias_max", "attn_type", "attn_uses_sequence_id", "rope", "rope_dail_config",
                          "rope_hf_config", "rope_impl", "rope_theta")
_FFN = ("bias", "d_model", "device", "expansion_ratio", "fc_type", "ffn_act_fn", "ffn_hidden_size")
FFN_KWARGS = {"mptglu": (_FFN, ()), "mptmlp": (_FFN, ()), "torch_dmoe": None}
# `model.init_config`: `name` picks one of these initializations, which reads the keys listed and takes any other
# key without a word (**kwargs): `init_std: 0.02` beside kaiming_normal_ (MPT's default) changes nothing.
_INIT = ("d_model", "emb_init_std", "emb_init_uniform_lim", "init_div_is_residual")
PARAM_INIT_FNS = {
    "baseline_": (*_INIT, "init_std", "n_layers"),
    "default_": (),
    "kaiming_normal_": (*_INIT, "fan_mode", "init_gain", "init_nonlinearity", "n_layers"),
    "kaiming_uniform_": (*_INIT, "fan_mode", "init_gain", "init_nonlinearity", "n_layers"),
    "neox_init_": ("d_model", "emb_init_std", "emb_init_uniform_lim", "n_layers"),
    "small_init_": (*_INIT, "n_layers"),
    "xavier_normal_": (*_INIT, "init_gain", "n_layers"),
    "xavier_uniform_": (*_INIT, "init_gain", "n_layers"),
}

# TrainConfig's fields and their types ("a|b": a Union; "dict"/"list": any mapping/sequence). llm-foundry builds
# an OmegaConf structured config from them, which refuses a value of another type (seed=abc, eval_first=maybe).
TRAIN_CONFIG = {
    "model": "dict", "tokenizer": "dict", "optimizer": "dict", "scheduler": "dict", "train_loader": "dict",
    "device_train_batch_size": "int|float", "device_eval_batch_size": "int|float", "max_duration": "int|str",
    "max_seq_len": "int", "seed": "int", "precision": "str", "code_paths": "list|None",
    "max_split_size_mb": "int|None", "expandable_segments": "bool", "cuda_load_lazy": "bool",
    "dist_timeout": "int|float", "fsdp_config": "dict|None", "tp_config": "dict|None",
    "accumulate_train_batch_on_tokens": "bool", "eval_interval": "int|str", "eval_loader": "dict|None",
    "eval_loaders": "list|None", "icl_tasks": "list|None", "icl_tasks_str": "str|None",
    "eval_gauntlet": "dict|None", "eval_gauntlet_str": "str|None", "icl_subset_num_batches": "int|None",
    "icl_seq_len": "int|None", "loggers": "dict|None", "progress_bar": "bool", "log_to_console": "bool",
    "python_log_level": "str|None", "console_log_interval": "int|str", "log_config": "bool",
    "callbacks": "dict|None", "algorithms": "dict|None", "save_folder": "str|None",
    "save_latest_filename": "str|None", "save_overwrite": "bool", "save_weights_only": "bool",
    "save_filename": "str|None", "save_interval": "str|int", "save_num_checkpoints_to_keep": "int",
    "load_path": "str|None", "load_weights_only": "bool", "load_strict_model_weights": "bool",
    "load_ignore_keys": "list|None", "save_ignore_keys": "list|None", "only_hf_checkpoint": "bool",
    "only_composer_checkpoint": "bool", "train_subset_num_batches": "int",
    "device_train_microbatch_size": "str|int|float", "global_train_batch_size": "int|None",
    "spin_dataloaders": "bool", "eval_subset_num_batches": "int", "eval_first": "bool",
    "compile_config": "dict|None", "metadata": "dict|None", "flatten_metadata": "bool", "run_name": "str|None",
    "autoresume": "bool", "profiler": "dict|None", "variables": "dict|None", "n_gpus": "int",
    "device_train_grad_accum": "str|int",
}
# composer's FSDP settings (`fsdp_config:`): FSDPConfig's fields, which refuses any other key (a TypeError when the
# trainer is built); with FSDP_VERSION=2 (the CPU clusters) FSDP2Config's, which drops any other key with a
# UserWarning in the log.
FSDP_CONFIG_KEYS = (
    "activation_checkpointing", "activation_checkpointing_reentrant", "activation_cpu_offload", "auto_wrap",
    "backward_prefetch", "backward_prefetch_limit", "cpu_offload", "data_parallel_replicate_degree",
    "data_parallel_shard_degree", "forward_prefetch", "forward_prefetch_limit", "ignored_modules",
    "keep_low_precision_grads", "limit_all_gathers", "load_monolith_rank0_only", "load_planner", "mixed_precision",
    "process_group", "save_planner", "sharded_ckpt_prefix_dir", "sharding_strategy", "state_dict_type",
    "sync_module_states", "te_checkpoint_wrapper", "te_shard_fp8_weight", "use_orig_params", "verbose",
)
FSDP2_CONFIG_KEYS = ("activation_checkpointing", "activation_cpu_offload", "device_mesh", "load_monolith_rank0_only",
                     "mixed_precision", "reshard_after_forward", "state_dict_type", "verbose")
# In-context learning tasks (`icl_tasks:`, a list, or the path of a YAML file holding one): llm-foundry's
# build_icl_evaluators reads ICL_TASK_OWN itself and passes every other key of a task to its `icl_datasets` class
# (by icl_task_type) as a keyword argument, with the tokenizer, pad id, shot count and paths it adds: another key is
# a TypeError as the trainer is built. It asserts ICL_TASK_REQUIRED.
ICL_TASK_OWN = ("label", "metric_names", "icl_task_type", "batch_size", "has_categories", "question_prelimiter")
ICL_TASK_REQUIRED = ("label", "dataset_uri", "icl_task_type", "num_fewshot")
_ICL_COMMON = ("dataset_uri", "tokenizer", "max_seq_len", "pad_tok_id", "num_fewshot", "destination_path",
               "fewshot_random_seed", "prompt_string", "example_delimiter", "continuation_delimiter", "prelimiter",
               "strip_dataset", "padding_size", "hf_loading_vars", "hf_parsing_map", "generation_kwargs")
ICL_TASK_KWARGS = {
    "generation_task_with_answers": (*_ICL_COMMON, "context_key", "answer_key", "base_batch", "batch_mapping",
                                     "cot_delimiter", "early_stopping_criteria", "do_normalization"),
    "language_modeling": (*_ICL_COMMON, "context_key", "tokenize_labels", "static_keys", "list_keys"),
    "multiple_choice": (*_ICL_COMMON, "context_key", "tensor_keys", "answer_key", "tokenize_labels", "batch_mapping",
                        "list_keys", "choices_key", "static_keys", "list_of_tensors_keys", "list_of_tuples_keys",
                        "list_of_primitives"),
    "schema": (*_ICL_COMMON, "answer_key", "tokenize_labels", "batch_mapping", "list_keys", "choices_key"),
}
# Tensor parallelism (`tp_config:`): llm-foundry pops `strategy` (a name in its `tp_strategies` registry), builds
# the layer plan from it and passes the rest to composer's TPConfig with that plan: TPConfig's fields but
# layer_plan, and any other key is a TypeError when the trainer is built.
TP_STRATEGIES = ("ffn",)
TP_CONFIG_KEYS = ("device_mesh", "strategy", "tensor_parallel_degree")
# The keyword arguments of each registered callback, logger and algorithm (as OPTIMIZERS; a callback built with the
# train config gets it from llm-foundry, not from its `callbacks.<name>` keys): another key is a TypeError when the
# trainer is built, on the cluster.
CALLBACK_KWARGS = {
    "async_eval": (("interval", "eval_run_config"), ("interval",)),
    "curriculum_learning": (("schedule", "duration"), ("schedule", "duration")),
    "dataset_swap": None,
    "early_stopper": (("monitor", "dataloader_label", "comp", "min_delta", "patience"), ("monitor",
        "dataloader_label")),
    "env_logging": (("workspace_dir", "log_git", "log_nvidia", "log_docker", "log_packages", "log_system", "log_gpu",
        "log_distributed", "packages_to_log"), ()),
    "eval_output_logging": None,
    "fdiff_metrics": (("diff_train_metrics", "diff_eval_metrics"), ()),
    "generate_callback": None,
    "global_lr_scaling": None,
    "hf_checkpointer": (("save_folder", "save_interval", "huggingface_folder_name", "precision", "overwrite",
        "mlflow_registered_model_name", "mlflow_logging_config", "flatten_imports", "final_register_only",
        "register_wait_seconds"), ("save_folder", "save_interval")),
    "kill_loss_spike": None,
    "layer_freezing": None,
    "load_checkpoint": (("load_path", "load_weights_only", "strict_model_weights", "ignore_keys", "event"),
        ("load_path",)),
    "loss_perp_v_len": None,
    "lr_monitor": ((), ()),
    "mbmoe_tok_per_expert": (("log_interval", "log_every_layer", "all_reduce_stats", "normalize"), ()),
    "memory_monitor": (("memory_keys", "dist_aggregate_batch_interval"), ()),
    "memory_snapshot": (("skip_batches", "interval", "max_entries", "folder", "filename", "remote_file_name",
        "overwrite"), ()),
    "mono_checkpoint_saver": (("save_folder", "batch_interval", "filename", "overwrite", "keep_optimizers"),
        ("save_folder", "batch_interval")),
    "nan_monitor": None,
    "oom_observer": (("max_entries", "folder", "filename", "remote_file_name", "overwrite"), ()),
    "optimizer_monitor": (("log_optimizer_metrics", "batch_log_interval"), ()),
    "run_timeout": (("timeout",), ()),
    "runtime_estimator": (("skip_batches", "time_unit"), ()),
    "scheduled_gc": (("batch_interval", "gen_1_batch_interval", "eval_keep_disabled"), ("batch_interval",)),
    "speed_monitor": (("window_size", "gpu_flops_available", "time_unit"), ()),
    "system_metrics_monitor": (("log_all_data",), ()),
}
LOGGER_KWARGS = {
    "in_memory_logger": ((), ()),
    "inmemory": ((), ()),
    "mlflow": (("experiment_name", "run_name", "tags", "tracking_uri", "rank_zero_only", "flush_interval",
        "model_registry_prefix", "model_registry_uri", "synchronous", "log_system_metrics", "rename_metrics",
        "ignore_metrics", "ignore_hyperparameters", "run_group", "resume", "logging_buffer_seconds",
        "log_duplicated_metric_every_n_steps"), ()),
    "mosaicml": (("log_interval", "ignore_keys", "ignore_exceptions"), ()),
    "tensorboard": (("log_dir", "flush_interval", "rank_zero_only"), ()),
    "wandb": (("project", "group", "name", "entity", "tags", "log_artifacts", "rank_zero_only", "init_kwargs"), ()),
}
ALGORITHM_KWARGS = {
    "alibi": (("max_sequence_length", "train_sequence_length_scaling"), ("max_sequence_length",)),
    "gated_linear_units": (("act_fn", "gated_layer_bias", "non_gated_layer_bias"), ()),
    "gradient_clipping": (("clipping_type", "clipping_threshold"), ("clipping_type", "clipping_threshold")),
    "low_precision_layernorm": (("apply_at",), ()),
}
