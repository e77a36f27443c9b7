# Training image for Slurm clusters with pyxis/enroot: the project's pinned dependencies with CUDA and
# flash attention. The code itself is not baked in: jobs mount the checkout they were submitted from
# (cluster.container.image + the storage mounts; see README "Containers").
#
#   docker build -t pretrain:latest .
#   enroot import -o /data/images/pretrain.sqsh dockerd://pretrain:latest
#   python -m train model=mpt-30b cluster=ndv5 storage=amlfs cluster.container.image=/data/images/pretrain.sqsh -m
FROM nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 VIRTUAL_ENV=/opt/venv
RUN apt-get update && apt-get install -y --no-install-recommends software-properties-common git \
    && add-apt-repository -y ppa:deadsnakes/ppa && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv $VIRTUAL_ENV
# `python3` in the job (submitit's interpreter inside the container) is this venv's.
ENV PATH=$VIRTUAL_ENV/bin:$PATH

WORKDIR /opt/pretrain
COPY pyproject.toml ./
# Install the dependencies only (an empty package skeleton satisfies setuptools); flash-attn builds against
# the image's CUDA, which takes a while.
RUN mkdir -p train data_prep hydra_plugins \
    && touch train/__init__.py data_prep/__init__.py \
    && pip install --upgrade pip wheel packaging ninja \
    && pip install torch==2.7.0 \
    && pip install '.[gpu]' \
    && pip uninstall -y slurm-pretrain
