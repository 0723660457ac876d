# rlserve CPU image: serves ONNX bundles with ONNX Runtime; no torch inside.
#   docker build -t rlserve .
#   docker run -p 8000:8000 rlserve                      # the embedded default policies
#   docker run -p 8000:8000 -v $PWD/models:/models -e RLSERVE_REPOSITORY=/models rlserve
# The GPU variant lives in docker/Dockerfile.gpu (CUDA base + onnxruntime-gpu).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY models ./models
COPY service ./service
# `pip install .` takes only the serving dependencies; torch is the [torch] extra.
RUN python -m venv /opt/rlserve \
 && /opt/rlserve/bin/pip install --no-cache-dir . \
 && find /opt/rlserve -name '__pycache__' -type d -prune -exec rm -rf {} + \
 && rm -rf /opt/rlserve/lib/python*/site-packages/pip /opt/rlserve/lib/python*/site-packages/setuptools

FROM ${BASE_IMAGE}
COPY --from=build /opt/rlserve /opt/rlserve
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/rlserve rlserve \
 && mkdir -p /models && chown rlserve:rlserve /models
ENV PATH=/opt/rlserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    RLSERVE_HOST=0.0.0.0 \
    RLSERVE_PORT=8000
USER rlserve
WORKDIR /home/rlserve
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os,urllib.request;urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('RLSERVE_PORT','8000'), timeout=2)"]
CMD ["rlserve", "serve"]
