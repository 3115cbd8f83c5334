# blackbox: multi-stage build; the final image holds the virtualenv and no build tools.
#   version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
#   docker build --build-arg BLACKBOX_VERSION="$version" -t "blackbox:$version" .
#   docker build --build-arg BLACKBOX_VERSION="$version" --build-arg BLACKBOX_EXTRAS=otel \
#     -t "blackbox:$version-otel" .             # the variant that exports spans
#   docker run --rm -e KAFKA_BOOTSTRAP_SERVERS=kafka:9092 -e REDIS_URL=redis://redis:6379/0 blackbox
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Extras installed with the package: `--build-arg BLACKBOX_EXTRAS=otel` makes the variant that
# exports spans (OTEL_* variables, docs/operations.md "Tracing"); empty: none.
ARG BLACKBOX_EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/blackbox
WORKDIR /src
COPY pyproject.toml README.md ./
COPY blackbox ./blackbox
# The wheel is built, then installed with its runtime dependencies only: exactly what
# tests/deploy/test_wheel.py runs (it runs this stage's RUN lines) before it starts the
# installed `blackbox run` and delivers through it. Every runtime dependency ships manylinux
# wheels, so no compiler is needed even here. The bytecode is compiled now: at run time the
# root filesystem may be read-only.
RUN /opt/blackbox/bin/pip wheel --no-deps --wheel-dir /tmp/wheels . \
    && for wheel in /tmp/wheels/blackbox-*.whl; do \
       /opt/blackbox/bin/pip install "$wheel${BLACKBOX_EXTRAS:+[$BLACKBOX_EXTRAS]}"; done \
    && /opt/blackbox/bin/pip uninstall --yes pip

FROM ${PYTHON_IMAGE}
# The release, as a build argument: a LABEL cannot read pyproject.toml. The build refuses a
# version other than the installed package's (below), so the label never names another.
ARG BLACKBOX_VERSION
LABEL org.opencontainers.image.title="blackbox" \
      org.opencontainers.image.description="Durable delayed-message service for Apache Kafka, backed by Redis." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${BLACKBOX_VERSION}"
RUN groupadd --system --gid 10001 blackbox \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
       --shell /usr/sbin/nologin blackbox
COPY --from=build /opt/blackbox /opt/blackbox
# No new bytecode files at run time: /tmp is the only place written.
ENV PATH=/opt/blackbox/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    BLACKBOX_LOG_FORMAT=json \
    BLACKBOX_HTTP_PORT=8080
RUN installed="$(blackbox --version)" \
    && if [ "$installed" != "blackbox ${BLACKBOX_VERSION}" ]; then \
         echo "BLACKBOX_VERSION='${BLACKBOX_VERSION}' but the package is '$installed': build with --build-arg BLACKBOX_VERSION=<pyproject.toml's version>" >&2; \
         exit 1; \
       fi
WORKDIR /tmp
USER 10001:10001
EXPOSE 8080
# /live: 200 while the firing clock ticks and no worker thread died.
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/live' % os.environ.get('BLACKBOX_HTTP_PORT', '8080'), timeout=2)"]
ENTRYPOINT ["blackbox"]
CMD ["run"]
