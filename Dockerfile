# Training image for Slurm clusters with pyxis/enroot: Python and the exact packages of requirements.lock (the
# versions the project is tested with), flash attention built against the image's CUDA, and a marker that says
# which checkout it was built from. The code itself is not baked in: jobs mount the checkout they were submitted
# from and run from it, so they never run a stale copy (README, Containers). Build and import it as:
#
#   docker build -t pretrain:latest .
#   enroot import -o /data/images/pretrain.sqsh dockerd://pretrain:latest
#   docker run --rm pretrain:latest cat /etc/slurm-pretrain-image.json > /data/images/pretrain.sqsh.json
#   python -m train model=mpt-30b cluster=ndv5 storage=amlfs cluster.container.image=/data/images/pretrain.sqsh -m
#
# Each task checks the image before anything else runs (common/image.py): a `python3` this project supports,
# pyproject.toml's dependencies at their pins, this checkout at its working folder.
FROM nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04

# One of ours: the marker's path, for whoever inspects the image (enroot's .sqsh keeps files, not labels).
LABEL org.opencontainers.image.title="slurm-pretrain" \
      org.opencontainers.image.description="Python, requirements.lock's packages and flash attention for slurm-pretrain jobs" \
      io.slurm-pretrain.marker="/etc/slurm-pretrain-image.json"

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 VIRTUAL_ENV=/opt/venv
RUN apt-get update && apt-get install -y --no-install-recommends software-properties-common git \
    && add-apt-repository -y ppa:deadsnakes/ppa && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv $VIRTUAL_ENV
# `python3` in the job (submitit's interpreter inside the container) is this venv's; pyxis keeps the image's PATH.
ENV PATH=$VIRTUAL_ENV/bin:$PATH

WORKDIR /opt/pretrain
COPY requirements.lock pyproject.toml ./
# The exact versions, without dependency resolution, as `make setup` installs them (torch 2.7.0 from PyPI is its
# CUDA 12.6 build, with the lock's nvidia-*-cu12 packages).
RUN pip install --upgrade pip \
    && pip install -r requirements.lock
# flash attention: llm-foundry's `gpu` extra (pyproject.toml: gpu) pins it; it builds against the torch above and
# the image's CUDA (--no-build-isolation), which takes a while. Everything else it needs is installed already.
RUN pip install ninja \
    && MAX_JOBS=8 pip install --no-build-isolation 'llm-foundry[gpu]==0.22.0'
# The marker, written once the packages are in: project, version, requirements.lock's hash, the interpreter and
# every installed package's version. Login nodes read it to tell one of ours (from the .sqsh with unsquashfs, or
# from the copy beside it), and say what a job would miss before it is submitted.
COPY common/image.py ./image.py
RUN python3 image.py marker /opt/pretrain > /etc/slurm-pretrain-image.json \
    && python3 -c "import json; m = json.load(open('/etc/slurm-pretrain-image.json')); assert m['packages']['flash-attn']"
