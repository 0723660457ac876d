# rlserve CPU image: serves ONNX bundles with ONNX Runtime; no torch inside.
#   docker build -t rlserve .
#   docker run -p 8000:8000 rlserve                      # the embedded default policies
#   docker run -p 8000:8000 -v $PWD/models:/models -e RLSERVE_REPOSITORY=/models rlserve
# The GPU variant lives in docker/Dockerfile.gpu (the same base, onnxruntime-gpu and the
# CUDA and cuDNN libraries from pip).
# Checked without a Docker engine by scripts/container_check.sh (see docs/container.md).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY models ./models
COPY service ./service
# `pip install .` (not editable) takes only the serving dependencies and copies the
# embedded default bundles in as package data; torch is the [torch] extra, left out. The
# [redis] extra (redis-py + hiredis, ~1 MB) lets replicas share sessions through
# RLSERVE_SESSION_STORE (docker/compose.yaml, profile "replicas"); the [grpc] extra
# (grpcio, ~6 MB) serves the Open Inference Protocol over gRPC with -e RLSERVE_GRPC_PORT=8001.
# pip itself and numpy's own test suite (17 MB) are removed afterwards: the running
# service never installs or self-tests anything. The bytecode pip compiled stays: /opt is
# read-only to the service user, so without it every start would compile numpy, fastapi
# and pydantic again (slower to become healthy).
RUN python -m venv /opt/rlserve \
 && /opt/rlserve/bin/pip install --no-cache-dir ".[redis,grpc]" \
 && /opt/rlserve/bin/python -m pip uninstall -y -q setuptools pip \
 && rm -rf /opt/rlserve/lib/python*/site-packages/numpy/*/tests

FROM ${BASE_IMAGE}
# The port is a build argument only so a check can build the image for a free port; the
# variable RLSERVE_PORT still overrides it at run time.
ARG PORT=8000
COPY --from=build /opt/rlserve /opt/rlserve
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/rlserve rlserve \
 && mkdir -p /models && chown rlserve:rlserve /models
ENV PATH=/opt/rlserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    RLSERVE_HOST=0.0.0.0 \
    RLSERVE_PORT=${PORT}
USER rlserve
WORKDIR /home/rlserve
EXPOSE ${PORT}
# Kept by `docker build`; buildah's default OCI format drops it with a warning.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os,urllib.request;urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('RLSERVE_PORT','8000'), timeout=2)"]
CMD ["rlserve", "serve"]
