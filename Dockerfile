# syntax=docker/dockerfile:1
# Serving images: no torch, no compilers. Both run scripts/install.sh, the same install CI runs.
#   docker build --target cpu -t s2s-serve:cpu .
#   docker build --target gpu -t s2s-serve:gpu .      (onnxruntime-gpu 1.31.1, CUDA 13: driver >= 580)
#   docker build --target gpu --build-arg GPU_LOCK=requirements/serve-gpu-cu12.lock -t s2s-serve:gpu-cu12 .
#                                                     (onnxruntime-gpu 1.26.0, CUDA 12: driver >= 525)
#   docker build --target models -t s2s-models .     (the model repository alone, for an init container)
# The image serves the repository baked into /app/models (S2S_MODELS; every embedded model). Another
# model: mount a bundle and point S2S_BUNDLE at it, or a repository (DIR/NAME/VERSION/) and S2S_MODELS:
#   docker run -v /models/mine:/models/mine -e S2S_BUNDLE=/models/mine s2s-serve:cpu
#   docker run -v /srv/models:/models -e S2S_MODELS=/models s2s-serve:cpu

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- CPU -------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build-cpu
WORKDIR /app
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY scripts/ scripts/
COPY proto/ proto/
COPY service/ service/
COPY export/__init__.py export/__init__.py
COPY loadtest/__init__.py loadtest/__init__.py
COPY models/default/ models/default/
COPY models/g2p/ models/g2p/
COPY models/grc-en-nt/ models/grc-en-nt/
COPY requirements/ requirements/
# Every package pinned and hashed (requirements/serve.lock, README "Locked dependencies"), the
# project itself installed with --no-deps: two builds a month apart install the same bytes.
RUN S2S_LOCK=requirements/serve.lock bash scripts/install.sh

FROM ${PYTHON_IMAGE} AS cpu
RUN useradd --create-home --uid 10001 s2s
COPY --from=build-cpu --chown=10001:10001 /app /app
WORKDIR /app
USER 10001
ENV S2S_MODELS=/app/models S2S_HOST=0.0.0.0 S2S_PORT=50051 S2S_METRICS_PORT=9090 \
    S2S_PROVIDERS=CPUExecutionProvider PYTHONUNBUFFERED=1
EXPOSE 50051 9090
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/app/.venv/bin/python", "-m", "service.cli.healthcheck"]
ENTRYPOINT ["/app/.venv/bin/python", "-m", "service.serve.server"]

# ---- GPU -------------------------------------------------------------------------------------
# No CUDA base image: CUDA and cuDNN come from NVIDIA's pip packages, pinned and hashed in the GPU
# lock beside onnxruntime-gpu (scripts/lock_gpu.py), so their major always matches the one the wheel
# was built for; onnxruntime.preload_dlls() loads them (service/decode/providers.py). The NVIDIA
# driver comes from the host (NVIDIA Container Toolkit / the device plugin). The image refuses to
# start on the CPU (S2S_REQUIRE_PROVIDER=cuda): a pod without a working GPU fails its start, with the
# reason in its log, instead of serving slowly. The build argument GPU_LOCK picks the CUDA major:
#   requirements/serve-gpu.lock       onnxruntime-gpu 1.31.1, CUDA 13.0 libraries, cuDNN 9.19 (driver >= 580)
#   requirements/serve-gpu-cu12.lock  onnxruntime-gpu 1.26.0, CUDA 12.9 libraries, cuDNN 9.28 (driver >= 525)
FROM ${PYTHON_IMAGE} AS build-gpu
ARG GPU_LOCK=requirements/serve-gpu.lock
WORKDIR /app
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY scripts/ scripts/
COPY proto/ proto/
COPY service/ service/
COPY export/__init__.py export/__init__.py
COPY loadtest/__init__.py loadtest/__init__.py
COPY models/default/ models/default/
COPY models/g2p/ models/g2p/
COPY models/grc-en-nt/ models/grc-en-nt/
COPY requirements/ requirements/
RUN S2S_LOCK=${GPU_LOCK} bash scripts/install.sh

FROM ${PYTHON_IMAGE} AS gpu
RUN useradd --create-home --uid 10001 s2s
COPY --from=build-gpu --chown=10001:10001 /app /app
WORKDIR /app
USER 10001
ENV S2S_MODELS=/app/models S2S_HOST=0.0.0.0 S2S_PORT=50051 S2S_METRICS_PORT=9090 \
    S2S_PROVIDERS=CUDAExecutionProvider,CPUExecutionProvider S2S_REQUIRE_PROVIDER=cuda \
    S2S_MAX_BATCH_HYPOTHESES=1280 S2S_MAX_BATCH_SENTENCES=256 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility PYTHONUNBUFFERED=1
EXPOSE 50051 9090
HEALTHCHECK --interval=15s --timeout=5s --start-period=90s --retries=3 \
    CMD ["/app/.venv/bin/python", "-m", "service.cli.healthcheck"]
ENTRYPOINT ["/app/.venv/bin/python", "-m", "service.serve.server"]

# ---- the model repository alone -------------------------------------------------------------------
# For deploy/overlays/repository-volume: an init container copies /repository onto the pod's volume.
FROM ${PYTHON_IMAGE} AS models
COPY --chown=10001:10001 models/default/ /repository/default/
COPY --chown=10001:10001 models/g2p/ /repository/g2p/
COPY --chown=10001:10001 models/grc-en-nt/ /repository/grc-en-nt/
USER 10001
