"""The fuzz table: bad command lines as a hurried user types them, each with its expected outcome: refused (exit 2,
`error: <key>:` and a fix) or warned (`warning: <key>:`, the look goes on). None may write anything:
PRETRAIN_ROOT and the working directory are empty temporary folders and stay empty, and no secret of the table
appears in what the command printed.

One test item per input, named by its command line: each runs the command in this process, through the function
`python -m train` runs (train.__main__.cli: the gate, Hydra's main, the checks, the plan), with the environment,
working directory and Hydra state of a fresh command. A few inputs of every kind run again as real `python -m train`
processes (e2e), which must say exactly what the same command said in-process.

Warned inputs are legal, so they go through `plan=true` (a run would train): the plan prints the same warnings.
"""
import contextlib
import io
import logging
import os
import re
import subprocess
import sys
import traceback

import pytest
from helpers import ROOT, TOKENIZER, command_env, run

SECRET = "s3cr3t-fuzz-4d9c2b"
HF_TOKEN = "hf_" + "Q" * 34
# (overrides, outcome, key). {tmp}: an existing folder; {empty}: an existing empty folder (not a mount point).
CASES = [
    # llm-foundry's TrainConfig types
    (["seed=abc"], "refused", "seed"),
    (["seed=1.5"], "refused", "seed"),
    (["seed=-1"], "refused", "seed"),
    (["seed=4294967296"], "refused", "seed"),
    (["seed=true"], "refused", "seed"),
    (["eval_first=maybe"], "refused", "eval_first"),
    (["progress_bar=maybe"], "refused", "progress_bar"),
    (["log_to_console=perhaps"], "refused", "log_to_console"),
    (["save_overwrite=2x"], "refused", "save_overwrite"),
    (["autoresume=maybe"], "refused", "autoresume"),
    (["dist_timeout=soon"], "refused", "dist_timeout"),
    (["max_seq_len=abc"], "refused", "max_seq_len"),
    (["max_seq_len=0"], "refused", "max_seq_len"),
    (["python_log_level=loud"], "refused", "python_log_level"),
    (["python_log_level=verbose"], "refused", "python_log_level"),
    (["save_num_checkpoints_to_keep=-5"], "refused", "save_num_checkpoints_to_keep"),
    (["save_num_checkpoints_to_keep=few"], "refused", "save_num_checkpoints_to_keep"),
    # the optimizer
    (["optimizer.lr=nan"], "refused", "optimizer.lr"),
    (["optimizer.lr=inf"], "refused", "optimizer.lr"),
    (["optimizer.lr=-inf"], "refused", "optimizer.lr"),
    (["optimizer.lr=-1"], "refused", "optimizer.lr"),
    (["optimizer.lr=0"], "refused", "optimizer.lr"),
    (["optimizer.lr=fast"], "refused", "optimizer.lr"),
    (["optimizer.weight_decay=-1"], "refused", "optimizer.weight_decay"),
    (["optimizer.weight_decay=nan"], "refused", "optimizer.weight_decay"),
    (["optimizer.eps=-1"], "refused", "optimizer.eps"),
    (["optimizer.eps=inf"], "refused", "optimizer.eps"),
    (["optimizer.betas=[0.9]"], "refused", "optimizer.betas"),
    (["optimizer.betas=[0.9,1.0]"], "refused", "optimizer.betas"),
    (["optimizer.betas=[-0.1,0.95]"], "refused", "optimizer.betas"),
    (["optimizer.betas=[0.9,0.95,0.99]"], "refused", "optimizer.betas"),
    (["optimizer.betas=0.9"], "refused", "optimizer.betas"),
    (["optimizer.name=sgdd"], "refused", "optimizer.name"),
    (["optimizer.name=adamw"], "refused", "optimizer.name"),
    (["optimizer.name=decoupled_lionw"], "refused", "optimizer.eps"),  # Lion takes no eps
    (["+optimizer.lrr=1e-3"], "refused", "optimizer.lrr"),
    (["+optimizer.momentum=0.9"], "refused", "optimizer.momentum"),
    # the scheduler
    (["scheduler.name=nonexistent_sched"], "refused", "scheduler.name"),
    (["scheduler.name=cosine"], "refused", "scheduler.name"),
    (["scheduler.alpha_f=-1"], "refused", "scheduler.alpha_f"),
    (["scheduler.alpha_f=nan"], "refused", "scheduler.alpha_f"),
    (["scheduler.t_warmup=100"], "refused", "scheduler.t_warmup"),
    (["scheduler.t_warmup=soon"], "refused", "scheduler.t_warmup"),
    (["+scheduler.t_max=forever"], "refused", "scheduler.t_max"),
    (["+scheduler.t_warm=10ba"], "refused", "scheduler.t_warm"),
    (["~scheduler.t_warmup"], "refused", "scheduler.t_warmup"),
    (["scheduler.alpha_f=2", "plan=true"], "warned", "scheduler.alpha_f"),
    (["max_duration=2ba", "plan=true"], "warned", "scheduler.t_warmup"),
    # the export: its keys without the group did nothing, without a word
    (["export.interval=10ba", "plan=true"], "warned", "export.interval"),
    (["export.format=hf"], "refused", "export.format"),  # was "precision None"
    (["+save_weights_only=true"], "refused", "save_weights_only"),  # its checkpoints cannot be resumed from
    # the data
    (["eval_loader.dataset.split=train", "plan=true"], "warned", "eval_loader.dataset.split"),
    (["+eval_loader.dataset.shuffle_sed=3", "plan=true"], "warned", "eval_loader.dataset.shuffle_sed"),  # dropped
    (["+model.n_layer=24", "plan=true"], "warned", "model.n_layer"),  # kept by MPTConfig, read by nothing
    (["+model.attn_config.qk_lnorm=true"], "refused", "model.attn_config.qk_lnorm"),  # TypeError at model build
    (["+model.init_config.init_std=0.02", "plan=true"], "warned", "model.init_config.init_std"),  # kaiming ignores it
    (["+fsdp_config.sharding_strateg=SHARD_GRAD_OP", "plan=true"], "warned", "fsdp_config.sharding_strateg"),
    (["+callbacks.speed_monitor.window_sze=10"], "refused", "callbacks.speed_monitor.window_sze"),  # TypeError
    (["+icl_tasks=[{label: x, dataset_uri: x.jsonl, icl_task_type: language_modeling, num_fewshot: 0}]"],
     "refused", "icl_tasks[0].num_fewshot"),  # list(0): a TypeError as the evaluators are built
    (["-m", "cluster.tasks_per_node=2", "+tp_config.strategy=ffn", "+tp_config.tensor_parallel_degre=2"],
     "refused", "tp_config.tensor_parallel_degre"),  # TPConfig's TypeError
    (["-m", "hparams_search=mpt_tiny_lr", "eval_loader=null"], "refused", "objective"),  # Optuna's value: none
    (["-m", "hparams_search=mpt_tiny_lr", "objective=eval/LanguageCrossEntropyy"], "refused", "objective"),  # none
    # an accuracy minimized: the worst trial reported as best_params, exit 0
    (["-m", "hparams_search=mpt_tiny_lr", "objective=eval/TokenAccuracy"], "refused", "hydra.sweeper.direction"),
    (["-m", "hparams_search=mpt_tiny_lr", "hydra.sweeper.direction=maximize"], "refused", "hydra.sweeper.direction"),
    (["-m", "hydra/sweeper=optuna", "objective=eval/TokenAccuracy"], "refused", "hydra.sweeper.direction"),  # its enum
    (["-m", "hparams_search=mpt_tiny_lr", "objective=eval_loss"], "refused", "objective"),  # no slash: was a traceback
    (["-m", "--cfg", "job"], "refused", "-m --cfg"),  # Hydra's ValueError, with a traceback
    # one value listed twice: was refused as two points writing one save_folder, the fix naming save_folder
    (["-m", "seed=1,1"], "refused", "seed"),
    (["-m", "optimizer.lr=1e-3,0.001", "seed=1,2"], "refused", "optimizer.lr"),
    # Optuna's database storage: a traceback after making the database (the pinned Optuna on SQLAlchemy 2)
    (["-m", "hparams_search=mpt_tiny_lr", "hydra.sweeper.storage=sqlite:///{tmp}/optuna.db"], "refused",
     "hydra.sweeper.storage"),
    (["-m", "hparams_search=mpt_tiny_lr", f"hydra.sweeper.storage=postgresql://me:{SECRET}@db/optuna", "plan=true"],
     "refused", "hydra.sweeper.storage"),
    (["data=c4", "variables.data_local=${nope}/c4"], "refused", "variables.data_local"),  # crashed the checks
    # the model
    (["model.attn_config.attn_impl=foo"], "refused", "model.attn_config.attn_impl"),
    (["model.attn_config.attn_impl=triton"], "refused", "model.attn_config.attn_impl"),
    (["model.attn_config.attn_impl=flash"], "refused", "model.attn_config.attn_impl"),  # no GPU here
    (["+model.attn_config.attn_type=flash_attention"], "refused", "model.attn_config.attn_type"),
    (["+model.attn_config.attn_pdrop=2"], "refused", "model.attn_config.attn_pdrop"),
    (["model.expansion_ratio=-1"], "refused", "model.expansion_ratio"),
    (["model.expansion_ratio=0", "plan=true"], "warned", "model.expansion_ratio"),
    (["model.d_model=0"], "refused", "model.d_model"),
    (["model.d_model=-128"], "refused", "model.d_model"),
    (["model.n_heads=0"], "refused", "model.n_heads"),
    (["model.n_heads=3"], "refused", "model.n_heads"),
    (["model.n_layers=0"], "refused", "model.n_layers"),
    (["model.vocab_size=0"], "refused", "model.vocab_size"),
    (["model.vocab_size=200"], "refused", "model.vocab_size"),
    (["model.max_seq_len=0"], "refused", "model.max_seq_len"),
    (["model.max_seq_len=64"], "refused", "max_seq_len"),
    (["+model.norm_type=batchnorm"], "refused", "model.norm_type"),
    (["+model.ffn_config.ffn_type=mlp"], "refused", "model.ffn_config.ffn_type"),
    (["model.loss_fn=mse"], "refused", "model.loss_fn"),
    (["model.loss_fn=fused_crossentropy"], "refused", "model.loss_fn"),  # no GPU here
    (["model.name=gpt2"], "refused", "model.name"),
    (["+model.resid_pdrop=1.5"], "refused", "model.resid_pdrop"),
    (["+model.emb_pdrop=-0.1"], "refused", "model.emb_pdrop"),
    (["+model.embedding_fraction=0"], "refused", "model.embedding_fraction"),
    (["+model.learned_pos_emb=maybe"], "refused", "model.learned_pos_emb"),
    (["tokenizer.name=''"], "refused", "tokenizer.name"),
    # precision, FSDP, checkpoints
    (["precision=bf16"], "refused", "precision"),
    (["precision=amp_bf16"], "refused", "precision"),
    (["fsdp_config.sharding_strategy=FULL_SHARDED"], "refused", "fsdp_config.sharding_strategy"),
    (["fsdp_config.state_dict_type=local"], "refused", "fsdp_config.state_dict_type"),
    (["fsdp_config=null"], "refused", "checkpoint"),
    (["autoresume=true", "checkpoint=none"], "refused", "autoresume"),
    (["load_path=/etc/hostname"], "refused", "load_path"),
    (["load_path=/etc"], "refused", "load_path"),
    (["load_path={tmp}/no-such-checkpoint"], "refused", "load_path"),
    # durations and intervals
    (["max_duration=0ba"], "refused", "max_duration"),
    (["max_duration=99999999999999999999ba"], "refused", "max_duration"),
    (["max_duration=10xx"], "refused", "max_duration"),
    (["max_duration=forever"], "refused", "max_duration"),
    (["max_duration=1.5"], "refused", "max_duration"),
    (["eval_interval=often"], "refused", "eval_interval"),
    (["save_interval=1000"], "refused", "save_interval"),
    (["console_log_interval=0ba"], "refused", "console_log_interval"),
    (["console_log_interval=10tok"], "refused", "console_log_interval"),
    (["console_log_interval=-5"], "refused", "console_log_interval"),
    (["console_log_interval=0e1ba"], "refused", "console_log_interval"),
    (["eval_subset_num_batches=0"], "refused", "eval_subset_num_batches"),
    (["eval_subset_num_batches=-2"], "refused", "eval_subset_num_batches"),
    (["train_subset_num_batches=0"], "refused", "train_subset_num_batches"),
    # batches
    (["device_train_microbatch_size=0"], "refused", "device_train_microbatch_size"),
    (["device_train_microbatch_size=auto"], "refused", "device_train_microbatch_size"),  # CPU
    (["device_train_microbatch_size=big"], "refused", "device_train_microbatch_size"),
    (["device_eval_batch_size=0"], "refused", "device_eval_batch_size"),
    (["global_train_batch_size=0"], "refused", "global_train_batch_size"),
    (["-m", "cluster.tasks_per_node=2", "global_train_batch_size=15"], "refused", "global_train_batch_size"),
    (["max_duration=1dur"], "refused", "max_duration"),  # composer: "TimeUnit.DURATION is not allowed"
    (["max_duration=3600sec"], "refused", "max_duration"),  # composer: "Wall clock time not an allowed time unit"
    (["eval_interval=1.5ba"], "refused", "eval_interval"),  # composer: batches are whole
    # legal (llm-foundry reduces a microbatch larger than a rank's share; composer trains an uneven last one)
    (["global_train_batch_size=12", "plan=true"], "warned", "device_train_microbatch_size"),
    (["global_train_batch_size=4", "plan=true"], "warned", "device_train_microbatch_size"),
    (["global_train_batch_size=1000000000"], "refused", "global_train_batch_size"),
    # workers, timeouts, the cluster
    # a trainer setting that was ours under cluster.: refused, its llm-foundry key as the fix
    (["cluster.dataloader_workers=0"], "refused", "cluster.dataloader_workers"),
    (["cluster.precision=amp_bf16"], "refused", "cluster.precision"),
    # the CPU presets load in the rank (0 workers, prefetch_factor null, persistent_workers false): torch refuses
    # 0 workers beside llm-foundry's defaults of the other two
    (["train_loader.num_workers=0", "train_loader.persistent_workers=true"], "refused", "train_loader.num_workers"),
    (["eval_loader.prefetch_factor=2"], "refused", "eval_loader.num_workers"),
    (["eval_loader.num_workers=-2"], "refused", "eval_loader.num_workers"),
    (["dist_timeout=0"], "refused", "dist_timeout"),
    (["dist_timeout=-5"], "refused", "dist_timeout"),
    (["cluster.timeout_min=0"], "refused", "cluster.timeout_min"),
    (["cluster.signal_delay_s=70000"], "refused", "cluster.signal_delay_s"),
    (["-m", "cluster=slurm-local", "data=mock", "cluster.timeout_min=60", "cluster.signal_delay_s=7200"], "refused",
     "cluster.signal_delay_s"),
    (["cluster.nodes=0"], "refused", "cluster.nodes"),
    (["-m", "cluster.nodes=2"], "refused", "cluster.nodes"),  # cluster=local: one machine
    (["-m", "cluster=slurm-local", "data=mock", "cluster.tasks_per_node=0"], "refused", "cluster.tasks_per_node"),
    (["cluster.max_num_timeout=-1"], "refused", "cluster.max_num_timeout"),
    (["cluster.cpus_per_task=0"], "refused", "cluster.cpus_per_task"),
    (["-m", "cluster=slurm-local", "data=mock", "cluster.mem_gb=0"], "refused", "cluster.mem_gb"),
    (["cluster.mfu=41.85", "plan=true"], "refused", "cluster.mfu"),
    (["storage.write_GBps=0"], "refused", "storage.write_GBps"),
    (["-m", "cluster.wait=false", "plan=true"], "warned", "cluster.wait"),
    (["cluster.preflight.on_fail=retry", "cluster.preflight.enabled=true"], "refused", "cluster.preflight.on_fail"),
    # names llm-foundry resolves through its registries
    (["train_loader.name=txt"], "refused", "train_loader.name"),
    (["eval_loader.name=json"], "refused", "eval_loader.name"),
    (["+callbacks.speedmonitor={}"], "refused", "callbacks.speedmonitor"),
    (["+callbacks.early_stoper={}"], "refused", "callbacks.early_stoper"),
    (["+algorithms.gradient_clip={}"], "refused", "algorithms.gradient_clip"),
    (["+loggers.tensorbord={}"], "refused", "loggers.tensorbord"),
    (["algorithms.gradient_clipping.clipping_type=l2"], "refused", "algorithms.gradient_clipping.clipping_type"),
    (["algorithms.gradient_clipping.clipping_threshold=0"], "refused",
     "algorithms.gradient_clipping.clipping_threshold"),
    (["callbacks.speed_monitor.window_size=0"], "refused", "callbacks.speed_monitor.window_size"),
    # Hydra's own refusals, and keys and presets that do not exist
    (["modle=mpt-125m"], "refused", "modle"),
    (["model=mpt-125"], "refused", "model"),
    (["checkpoint=shard"], "refused", "checkpoint"),
    (["cluster=ndv6"], "refused", "cluster"),
    (["-m", "model=mpt-125m,mpt-350"], "refused", "model"),
    (["tokenizer.name=модель"], "refused", "tokenizer.name"),
    (["run_name=café"], "refused", "run_name"),
    (["cluster.env.X=$(touch {tmp}/pwned)"], "refused", "cluster.env.X"),
    (["optimizer.betas=[0.9,0.95"], "refused", "optimizer.betas"),
    (["seed"], "refused", "seed"),
    (["save_weights_only=true"], "refused", "save_weights_only"),
    (["cluster.nodes=two"], "refused", "cluster.nodes"),  # our typed groups (train/config/schema.py)
    (["cluster.node=2"], "refused", "cluster.node"),
    (["cluster.wait=maybe"], "refused", "cluster.wait"),
    (["storage.write_GBps=fast"], "refused", "storage.write_GBps"),
    (["-m", "cluster.tasks_per_node=1,x"], "refused", "cluster.tasks_per_node"),
    (["+save_intervl=100ba"], "refused", "save_intervl"),
    (["plan=yes"], "refused", "plan"),
    (["run_name=../escape"], "refused", "run_name"),
    (["run_name=a/b"], "refused", "run_name"),
    # a Slurm preset without -m, outside an allocation
    (["model=mpt-125m", "cluster=ndv5", "data=mock", "max_duration=2ba"], "refused", "cluster"),
    (["cluster=slurm-local", "data=mock"], "refused", "cluster"),
    # credentials, by name and by value: refused, never echoed
    (["-m", f"cluster.env.MLFLOW_TRACKING_URI=http://user:{SECRET}@host/"], "refused",
     "cluster.env.MLFLOW_TRACKING_URI"),
    ([f"cluster.env.AWS_ACCESS_KEY_ID={SECRET}"], "refused", "cluster.env.AWS_ACCESS_KEY_ID"),
    ([f"cluster.env.AWS_SECRET_ACCESS_KEY={SECRET}"], "refused", "cluster.env.AWS_SECRET_ACCESS_KEY"),
    ([f"cluster.env.AWS_SESSION_TOKEN={SECRET}"], "refused", "cluster.env.AWS_SESSION_TOKEN"),
    ([f"cluster.env.HF_AUTH={SECRET}"], "refused", "cluster.env.HF_AUTH"),
    ([f"cluster.env.HUGGING_FACE_HUB_TOKEN={SECRET}"], "refused", "cluster.env.HUGGING_FACE_HUB_TOKEN"),
    ([f"cluster.env.WANDB_API_KEY={SECRET}"], "refused", "cluster.env.WANDB_API_KEY"),
    ([f"cluster.env.MLFLOW_TRACKING_PASSWORD={SECRET}"], "refused", "cluster.env.MLFLOW_TRACKING_PASSWORD"),
    ([f"cluster.env.AZURE_OPENAI_API_KEY={SECRET}"], "refused", "cluster.env.AZURE_OPENAI_API_KEY"),
    ([f"cluster.env.AZURE_CLIENT_SECRET={SECRET}"], "refused", "cluster.env.AZURE_CLIENT_SECRET"),
    ([f"cluster.env.DATABRICKS_TOKEN={SECRET}"], "refused", "cluster.env.DATABRICKS_TOKEN"),
    ([f"cluster.env.X={HF_TOKEN}"], "refused", "cluster.env.X"),
    ([f"+tokenizer.kwargs.token={SECRET}"], "refused", "tokenizer.kwargs.token"),
    ([f"cluster.setup=['export HF_TOKEN={SECRET}']"], "refused", "cluster.setup[0]"),
    ([f"cluster.setup=['pip install --index-url https://u:{SECRET}@pypi.example.com/simple x']"], "refused",
     "cluster.setup[0]"),
    ([f"variables.data_remote=https://u:{SECRET}@host/c4"], "refused", "variables.data_remote"),
    (["-m", f"variables.data_remote=https://u:{SECRET}@host/c4", "plan=json"], "refused", "variables.data_remote"),
    (["logger=mlflow", f"loggers.mlflow.tracking_uri='https://bob:{SECRET}@mlflow.example.com'"], "refused",
     "loggers.mlflow.tracking_uri"),
    (["logger=wandb", f"+loggers.wandb.init_kwargs.settings.api_key={SECRET}"], "refused",
     "loggers.wandb.init_kwargs.settings.api_key"),
    ([f"cluster.env.WANDB_API_KEY={SECRET}#x"], "refused", "cluster.env.WANDB_API_KEY"),  # Hydra cannot parse it
    # storage and data on this node
    (["storage=amlfs", "storage.root={empty}", "storage.mounts=[{empty}]"], "refused", "storage.mounts"),
    (["storage=amlfs", "storage.root={tmp}/data", "storage.mounts=[/nonexistent]"], "refused", "storage.mounts"),
    (["storage=amlfs", "storage.root={tmp}/data", "storage.mounts=[/]", "storage.tier=AMLFS-100"], "refused",
     "storage.tier"),
    (["storage=blob", "storage.root={tmp}/blob", "storage.mounts=[/]", "storage.data_local_root=null"], "refused",
     "storage.data_local_root"),
    (["variables.data_local={tmp}/my-c4"], "refused", "variables.data_local"),
    (["data=mds", f"tokenizer.name={TOKENIZER}"], "refused", "variables.data_local"),
    (["data=mds", f"tokenizer.name={TOKENIZER}", "variables.data_local={tmp}/nope"], "refused",
     "variables.data_local"),
    (["cluster.container.image={tmp}/nope.sqsh", "-m", "cluster=ndv5", "data=mock", "global_train_batch_size=64"],
     "refused", "cluster.container.image"),
    # where a run's folders go (PRETRAIN_ROOT for storage=local): a file was a traceback, /proc "no room"
    (["storage.root=/dev/null"], "refused", "storage.root"),
    (["storage.root=/dev/null/runs"], "refused", "storage.root"),
    (["storage.root=/proc/pretrain"], "refused", "storage.root"),
    # negative times: a negative warmup trained, exit 0
    (["max_duration=-5ba"], "refused", "max_duration"),
    (["eval_interval=-1ba"], "refused", "eval_interval"),
    (["save_interval=-2ba"], "refused", "save_interval"),
    (["scheduler.t_warmup=-1ba"], "refused", "scheduler.t_warmup"),
    (["+scheduler.t_max=-1ba"], "refused", "scheduler.t_max"),
    # no evaluation by an interval that never fires: trained without a word, exit 0 (eval_loader=null says it)
    (["eval_interval=0", "plan=true"], "warned", "eval_interval"),
    (["eval_interval=0ba", "plan=true"], "warned", "eval_interval"),
    # not true or false where a flag is read: a number OmegaConf reads as true, a word any code reads as true
    (["eval_first=2"], "refused", "eval_first"),
    (["save_overwrite=2"], "refused", "save_overwrite"),
    (["eval_first='yes please'"], "refused", "eval_first"),
    (["fsdp_config.activation_checkpointing=maybe"], "refused", "fsdp_config.activation_checkpointing"),
    (["fsdp_config.limit_all_gathers=2"], "refused", "fsdp_config.limit_all_gathers"),
    (["+fsdp_config.use_orig_params=maybe"], "refused", "fsdp_config.use_orig_params"),
    (["train_loader.drop_last=maybe"], "refused", "train_loader.drop_last"),
    (["+train_loader.pin_memory=maybe"], "refused", "train_loader.pin_memory"),
    (["train_loader.dataset.shuffle=maybe"], "refused", "train_loader.dataset.shuffle"),
    (["+model.use_cache=maybe"], "refused", "model.use_cache"),
    # the tokenizer's keyword arguments: a length of letters trained; a padding side transformers refuses was a
    # traceback after the run folder was made; a misspelt one is kept by the tokenizer and read by nothing
    (["tokenizer.kwargs.model_max_length=abc"], "refused", "tokenizer.kwargs.model_max_length"),
    (["tokenizer.kwargs.model_max_length=-5"], "refused", "tokenizer.kwargs.model_max_length"),
    (["+tokenizer.kwargs.model_max_length=abc"], "refused", "tokenizer.kwargs.model_max_length"),  # Hydra's error
    (["+tokenizer.kwargs.padding_side=middle"], "refused", "tokenizer.kwargs.padding_side"),
    (["+tokenizer.kwargs.use_fast=maybe"], "refused", "tokenizer.kwargs.use_fast"),
    (["tokenizer.kwargs=[1,2]"], "refused", "tokenizer.kwargs"),
    (["+tokenizer.kwargs.model_max_lenght=128", "plan=true"], "warned", "tokenizer.kwargs.model_max_lenght"),
    # a run name with a quote, quoted as Hydra asks: it trained
    (["run_name=\"a'b\""], "refused", "run_name"),
    (["run_name='a\"b'"], "refused", "run_name"),
    # a near miss of a key under a group: Hydra's advice to add it with + came first, exit 1
    (["model.d_modle=128"], "refused", "model.d_modle"),
    (["scheduler.t_warmpu=10ba"], "refused", "scheduler.t_warmpu"),
    (["yaml={tmp}"], "refused", "yaml"),  # a folder: "no such file"
    # save policies: no checkpoint before max_duration=40ba (the final one alone)
    (["cluster=ndv5", "save_interval=1ep", "plan=true"], "refused", "save_interval"),
    (["cluster=ndv5", "save_interval=99999tok", "plan=true"], "refused", "save_interval"),
    (["save_interval=1000sp", "plan=true"], "warned", "save_interval"),
    (["save_interval=1dur", "plan=true"], "warned", "save_interval"),
    # secrets by shape
    ([f"+variables.u=https://x?token={SECRET}&y=1"], "refused", "variables.u"),  # unquoted: Hydra cannot read it
    ([f"+variables.u='https://api.example.com/v1?access_token={SECRET}'"], "refused", "variables.u"),
    ([f"+variables.auth='Bearer {SECRET}'"], "refused", "variables.auth"),
    ([f"+variables.hook=https://hooks.slack.com/services/T000/B000/{SECRET}"], "refused", "variables.hook"),
    ([f"variables.anything={HF_TOKEN}"], "refused", "variables.anything"),  # no +: Hydra's own error echoed it
    ([f"+cluster.env.MY_CRED={SECRET}"], "refused", "cluster.env.MY_CRED"),
    ([f"cluster.setup=['wandb login {SECRET}']"], "refused", "cluster.setup[0]"),
    ([f"cluster.setup=['huggingface-cli login --token {SECRET}']"], "refused", "cluster.setup[0]"),
    ([f"cluster.setup=['export X_CRED={SECRET}']"], "refused", "cluster.setup[0]"),
    ([f"cluster.setup=['az storage blob list --account-key {SECRET}']"], "refused", "cluster.setup[0]"),
    ([f"cluster.setup=['aws configure set aws_secret_access_key {SECRET}']"], "refused", "cluster.setup[0]"),
    ([f"+variables.storage_key={SECRET}"], "refused", "variables.storage_key"),
    ([f"cluster.setup=[export WANDB_API_KEY={SECRET}]"], "refused", "cluster.setup"),  # Hydra cannot read it
    (["-m", f"cluster.setup=['wandb login {SECRET}']", "plan=json"], "refused", "cluster.setup[0]"),
    # paths that fail on the allocation
    (["train_loader.dataset.split=nosplit"], "refused", "train_loader.dataset.split"),
    (["eval_loader.dataset.local={tmp}/nope"], "refused", "eval_loader.dataset.local"),
    (["tokenizer.name={tmp}/no-tokenizer"], "refused", "tokenizer.name"),
    (["tokenizer.name=my/tokenizers/v2"], "refused", "tokenizer.name"),
    (["model.init_device=cuda"], "refused", "model.init_device"),
    (["-m", "cluster=slurm-local", "data=mock", "model.init_device=cuda"], "refused", "model.init_device"),
    # meta weights sharded by FSDP2 on ranks without a GPU: "Found no NVIDIA driver" after the queue
    (["-m", "cluster.tasks_per_node=2", "model.init_device=meta"], "refused", "model.init_device"),
    (["data=mds", f"tokenizer.name={TOKENIZER}", "variables.data_local={tmp}/cache", "variables.data_remote={tmp}/blob"],
     "refused", "variables.data_remote"),
]


def _id(overrides: list) -> str:
    """A test id: the command line, short (the secrets by name, the tokenizer's path by its own)."""
    text = " ".join(overrides).replace(SECRET, "SECRET").replace(HF_TOKEN, "HF_TOKEN").replace(str(TOKENIZER),
                                                                                                  "TOKENIZER")
    return text if len(text) <= 60 else text[:57] + "..."


def _ids(cases) -> list:
    ids = []
    for overrides, _, _ in cases:
        name = _id(overrides)
        ids.append(name if name not in ids else f"{name} #{sum(i.startswith(name) for i in ids) + 1}")
    return ids


def _folders(tmp_path) -> dict:
    """root: PRETRAIN_ROOT; cwd: the working directory; scratch: {tmp}; empty: {empty}. All made empty."""
    folders = {name: tmp_path / name for name in ("root", "cwd", "scratch", "empty")}
    for folder in folders.values():
        folder.mkdir()
    return folders


def _command(overrides: list, folders: dict) -> list:
    return [o.replace("{tmp}", str(folders["scratch"])).replace("{empty}", str(folders["empty"])) for o in overrides]


def _environment(folders: dict) -> dict:
    # as from a clean login shell (no WORLD_SIZE, SLURM_JOB_ID, tracking URI: helpers.command_env)
    return command_env(folders["root"], {"HF_HUB_OFFLINE": "1"})


class _Console(io.TextIOBase):
    """sys.stdout or sys.stderr of the commands this process runs: one object for all of them, as a process has one
    stderr, writing into the running command's own text. A handler a library made in an earlier command (Optuna's
    logger binds the stream it found) writes into this command's, as it would in a process of its own."""

    encoding = "utf-8"

    def __init__(self):
        super().__init__()
        self.into = None  # the running command's text (io.StringIO); None between commands: the test's own

    def write(self, text: str) -> int:
        return (self.into or (sys.__stdout__ if self is _OUT else sys.__stderr__)).write(text)

    def writable(self) -> bool:
        return True


_OUT, _ERR = _Console(), _Console()


def in_process(args: list, folders: dict, monkeypatch) -> subprocess.CompletedProcess:
    """`python -m train ARGS` in this process (train.__main__.cli), with the environment, working directory and
    argv a real command has, and what a fresh process starts from: no Hydra state (GlobalHydra, HydraConfig) and no
    logging handler (Hydra configures its own as it composes). Exit status, stdout and stderr as a process's:
    SystemExit's code; an exception that escapes is the traceback Python would print, exit 1."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from train.__main__ import cli

    env = _environment(folders)
    for name in [k for k in os.environ if k not in env]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(folders["cwd"])
    monkeypatch.setattr(sys, "argv", [str(ROOT / "train" / "__main__.py")])
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers, status = [], 0
    root.setLevel(logging.WARNING)
    _OUT.into, _ERR.into = io.StringIO(), io.StringIO()
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None
    try:
        with contextlib.redirect_stdout(_OUT), contextlib.redirect_stderr(_ERR):
            try:
                cli(list(args))
            except SystemExit as exit_:
                code = exit_.code
                status = code if isinstance(code, int) else 0 if code is None else 1
                if not isinstance(code, (int, type(None))):
                    print(code, file=sys.stderr)  # as Python prints sys.exit("message")
            except Exception:  # noqa: BLE001 -- what the interpreter would print, exit 1
                traceback.print_exc()
                status = 1
        out, err = _OUT.into.getvalue(), _ERR.into.getvalue()
    finally:
        _OUT.into = _ERR.into = None
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers = handlers
        root.setLevel(level)
    return subprocess.CompletedProcess(["-m", "train", *args], status, out, err)


def in_a_process(args: list, folders: dict) -> subprocess.CompletedProcess:
    """`python -m train ARGS`, a real process."""
    return run("-m", "train", *args, root=folders["root"], env={"HF_HUB_OFFLINE": "1"}, cwd=folders["cwd"],
               timeout=180)


def wrong(case, proc, folders: dict) -> list:
    """What is not as the table expects of this command: [] when refused (or warned) by its key with a fix, without a
    traceback or a secret, and nothing was written."""
    _, outcome, key = case
    lines = proc.stderr.splitlines()
    level = "error" if outcome == "refused" else "warning"
    named = [i for i, line in enumerate(lines) if line.startswith(f"{level}: ")
             and line[len(level) + 2:].split(": ")[0].split("] ")[-1] == key]
    found = []
    if proc.returncode != (2 if outcome == "refused" else 0):
        found.append(f"exit {proc.returncode}")
    if not named:
        found.append(f"no `{level}: {key}:` line")
    elif not all(i + 1 < len(lines) and lines[i + 1].startswith("  fix: ") for i in named):
        found.append("no fix line")
    if "Traceback" in proc.stderr:
        found.append("a traceback")
    if SECRET in proc.stdout + proc.stderr or HF_TOKEN in proc.stdout + proc.stderr:
        found.append("the secret was echoed")
    work = folders["root"].parent
    written = [str(p.relative_to(work)) for f in folders.values() for p in f.rglob("*")]
    if written:
        found.append(f"wrote {written[:3]}")
    return found


def said(args: list, proc, found: list) -> str:
    """The failure: the command line, what is wrong, the ends of what it printed."""
    return (f"python -m train {' '.join(args)}: {', '.join(found)}\n--- stdout (end)\n{proc.stdout[-1000:]}"
            f"\n--- stderr (end)\n{proc.stderr[-3000:]}")


@pytest.mark.table  # in-process, ~0.25 s of CPU each: make test runs them, make test-fast leaves them out
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_a_bad_input_is_refused_or_warned_by_key_and_nothing_is_written(case, tmp_path, monkeypatch):
    folders = _folders(tmp_path)
    args = _command(case[0], folders)
    proc = in_process(args, folders, monkeypatch)
    found = wrong(case, proc, folders)
    assert not found, said(args, proc, found)


# Inputs of every kind, as real processes: a value the checks refuse, a warning in a plan, Hydra's grammar and its
# composition, its two commands at once, a preset that does not exist, a sweep's point and its settings (Optuna),
# a credential, a Slurm preset outside an allocation (the environment), a folder on this node.
IN_A_PROCESS = [
    ["seed=abc"],
    ["eval_interval=0", "plan=true"],
    ["optimizer.betas=[0.9,0.95"],
    ["model.d_modle=128"],
    ["-m", "--cfg", "job"],
    ["cluster=ndv6"],
    ["-m", "seed=1,1"],
    ["-m", "cluster.wait=false", "plan=true"],
    ["-m", "hparams_search=mpt_tiny_lr", "objective=eval/TokenAccuracy"],
    ["-m", "hparams_search=mpt_tiny_lr", "objective=eval_loss"],
    [f"cluster.env.WANDB_API_KEY={SECRET}"],
    ["cluster=slurm-local", "data=mock"],
    ["storage.root=/dev/null"],
    ["load_path={tmp}/no-such-checkpoint"],
]
TWINS = [case for case in CASES if case[0] in IN_A_PROCESS]


@pytest.mark.e2e  # one process per input
@pytest.mark.parametrize("case", TWINS, ids=_ids(TWINS))
def test_a_real_process_says_what_the_command_said_in_process(case, tmp_path, monkeypatch):
    folders = _folders(tmp_path)
    args = _command(case[0], folders)
    proc = in_a_process(args, folders)
    found = wrong(case, proc, folders)
    assert not found, said(args, proc, found)
    same = in_process(args, folders, monkeypatch)
    assert (same.returncode, steady(same.stdout), steady(same.stderr)) == \
        (proc.returncode, steady(proc.stdout), steady(proc.stderr)), \
        f"python -m train {' '.join(args)}: in this process (left) it said otherwise than as a process (right)"


def steady(text: str) -> str:
    """The text without what changes between two runs of one command: the time of day (Optuna's log lines) and a
    file system's free space (the plan's checkpoints)."""
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", "<time>", text)
    return re.sub(r"[\d.]+ [KMGTP]?i?B free", "<space> free", text)


def test_the_fuzz_table_has_at_least_120_distinct_inputs():
    assert len({tuple(c[0]) for c in CASES}) == len(CASES) >= 120
    assert {outcome for _, outcome, _ in CASES} == {"refused", "warned"}
    assert len(TWINS) == len(IN_A_PROCESS)  # each one a row of the table
    assert len(set(_ids(CASES))) == len(CASES)
