"""The distributed environment composer reads, from the submitit job this process runs in.

One task per device: submitit starts every rank itself (locally or through srun), so there is no torchrun
or composer launcher. CUDA_VISIBLE_DEVICES is left alone: composer picks `cuda:{LOCAL_RANK}`.
"""
import os
import zlib


def master_port(job_id: str) -> int:
    """A port every rank of a job derives alike, and that differs between jobs sharing a node."""
    return 20000 + zlib.crc32(str(job_id).encode()) % 20000


def export_from_submitit() -> dict:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT; return them.

    Outside a submitit job (a plain run) nothing is set: composer then runs as a single process.
    """
    if "SUBMITIT_EXECUTOR" not in os.environ:
        return {}
    import submitit

    job = submitit.JobEnvironment()
    env = {
        "RANK": job.global_rank,
        "WORLD_SIZE": job.num_tasks,
        "LOCAL_RANK": job.local_rank,
        "LOCAL_WORLD_SIZE": job.num_tasks // job.num_nodes,
        "NODE_RANK": job.node,
        "MASTER_ADDR": job.hostnames[0],
        "MASTER_PORT": master_port(job.job_id),
    }
    env = {k: str(v) for k, v in env.items()}
    os.environ.update(env)
    return env


def decided_on_rank_0(decide):
    """What `decide()` returns on global rank 0, on every rank; its error, raised on every rank: a raise on rank 0
    alone would leave the others waiting in their next collective until dist_timeout."""
    from composer.utils import dist

    box = [None]
    if dist.get_global_rank() == 0:
        try:
            box = [("decided", decide())]
        except Exception as err:
            box = [("failed", err)]
    dist.broadcast_object_list(box)
    kind, value = box[0]
    if kind == "failed":
        raise value  # rank 0's error, on every rank
    return value


def gloo_reduce_scatter_averages() -> None:
    """Make a reduce-scatter asked to average over gloo average. torch 2.7's gloo sums instead, without a word
    (pytorch/pytorch#162338), and FSDP2 asks for the average of fp32 gradients: every CPU run of more than one
    rank trained on gradients world_size times too large. AdamW hides most of it; gradient clipping (the default
    norm 1.0) does not: 2 ranks and 1 rank parted at the first step whose gradient norm fell under the threshold.
    Checked by one reduce-scatter at the start (every rank, all alike), so a torch that averages is left alone;
    where gloo sums, that process's reduce-scatters with AVG on a gloo group become SUM and a division by the
    group's size (the average asked for, as NCCL computes it). Other backends and ops are untouched."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() < 2 or dist.get_backend() != "gloo":
        return
    if getattr(dist.reduce_scatter_tensor, "averages_over_gloo", False):
        return  # already in place (a second start in this process)
    world = dist.get_world_size()
    probe = torch.empty(1)
    dist.reduce_scatter_tensor(probe, torch.ones(world), op=dist.ReduceOp.AVG)
    if probe.item() == 1.0:
        return  # this torch averages
    if probe.item() != float(world):
        raise RuntimeError(f"gloo's reduce-scatter with AVG of ones over {world} ranks gave {probe.item()}: "
                           "neither the average (1) nor the sum; the gradients of FSDP2 would be wrong")
    summing = dist.reduce_scatter_tensor

    def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if op != dist.ReduceOp.AVG or dist.get_backend(group) != "gloo":
            return summing(output, input, op=op, group=group, async_op=async_op)
        if async_op:  # the division would have to wait for the work: not needed by FSDP2 on CPU
            raise NotImplementedError("an asynchronous reduce-scatter with AVG over gloo (gloo would sum, "
                                      "pytorch/pytorch#162338)")
        work = summing(output, input, op=dist.ReduceOp.SUM, group=group)
        output.div_(dist.get_world_size(group))
        return work

    reduce_scatter_tensor.averages_over_gloo = True
    dist.reduce_scatter_tensor = reduce_scatter_tensor
