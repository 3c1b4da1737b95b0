# syntax=docker/dockerfile:1
# One image for the six Nodeflow services; the command picks the service: `python -m <package>`.
# Dependencies come only from uv.lock. The default (last) stage is the runtime image, without
# the cluster simulator; `--target simulator` builds the dev-only simulator image that
# docker-compose.yml runs.
#   make image IMAGE=registry.example.com/nodeflow:0.1.0   (docker or podman; build and push)
# The base is pinned to an exact Python patch release on an exact Debian release, and by the
# digest of that tag's multi-architecture index, so a re-pushed tag cannot change what we build.
# To move it: `docker buildx imagetools inspect python:<version>-slim-bookworm` and take the
# top-level Digest.
# Nodeflow runs on Python 3.11 to 3.13; the image stays on 3.11 until a newer base is pinned the
# same way (the clustersim pruning below follows whichever Python the base has).
ARG PYTHON_BASE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

FROM ${PYTHON_BASE} AS build
# Same uv as the Makefile; never let uv download a Python of its own.
ENV UV_VERSION=0.13.9 \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/opt/nodeflow
RUN pip install --no-cache-dir "uv==${UV_VERSION}"
WORKDIR /src
# Dependencies first, in their own layer, so a code change does not reinstall them.
COPY pyproject.toml uv.lock README.md LICENSE ./
RUN uv sync --frozen --no-dev --no-install-project
COPY libs ./libs
COPY services ./services
COPY clustersim ./clustersim
# --no-editable installs the project into the environment, so /src is not needed at run time.
RUN uv sync --frozen --no-dev --no-editable
# The runtime environment: the same, without the simulator package.
RUN cp -a /opt/nodeflow /opt/nodeflow-runtime \
 && rm -rf /opt/nodeflow-runtime/lib/python3.*/site-packages/clustersim

FROM ${PYTHON_BASE} AS simulator
RUN groupadd --system --gid 10001 nodeflow \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin nodeflow \
 && install -d -o 10001 -g 10001 -m 0750 /run/nodeflow
COPY --from=build /opt/nodeflow /opt/nodeflow
# The CRDs, for the simulator's API emulator (`python -m clustersim --crd-dir ...`).
COPY k8s/crds /usr/share/nodeflow/crds
ENV PATH=/opt/nodeflow/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HTTP_PORT=8080
USER 10001:10001
EXPOSE 8080
CMD ["python", "-m", "clustersim", "--crd-dir", "/usr/share/nodeflow/crds"]

FROM ${PYTHON_BASE} AS runtime
RUN groupadd --system --gid 10001 nodeflow \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin nodeflow
COPY --from=build /opt/nodeflow-runtime /opt/nodeflow
ENV PATH=/opt/nodeflow/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HTTP_PORT=8080
USER 10001:10001
EXPOSE 8080
# No default service: run e.g. `python -m nodeset_controller`.
CMD ["python", "-c", "print('run: python -m <k8s_watcher|slurm_syncer|nodeset_controller|maintenance_scheduler|topology_placer|metrics_exporter>')"]
