# attnd container image: a Debian bookworm builder compiles build/attnd, and a bookworm-slim
# runtime carries only the shared libraries that binary links against.
#
#   docker build -t attnd:0.1.0 .         (the tag the Kubernetes base uses; docs/deployment.md)
#   docker run --rm -p 8080:8080 attnd:0.1.0
#   docker run --rm -p 8080:8080 -v "$PWD/models:/models:ro" \
#       -e ATTND_MODEL=encoder=/models/encoder.safetensors attnd:0.1.0
#
# `make test` proves this file without a Docker engine (tests/deploy/check_image.sh): the
# runtime packages below are exactly those that provide the libraries build/attnd needs, every
# attnd flag and ATTND_* variable used here exists in `attnd --help`, and the file passes a
# structural lint. See docs/deployment.md.

# ---- build stage ---------------------------------------------------------------------------
# Debian 12 (bookworm), the release attnd is built and tested on, where the ldd check runs.
FROM debian:bookworm-20250520 AS build

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential \
        pkg-config \
        libmicrohttpd-dev \
        libgnutls28-dev \
        libjansson-dev \
        libopenblas-dev \
        zlib1g-dev \
        libnghttp2-dev \
        libprotobuf-c-dev \
        protobuf-c-compiler \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# Only what build/attnd is made from (.dockerignore keeps tests, deploy files and build/ out).
COPY Makefile ./
COPY engine/ engine/
COPY api/ api/
COPY server/ server/
RUN make -j"$(nproc)" build/attnd \
    && strip --strip-debug build/attnd

# ---- runtime stage -------------------------------------------------------------------------
FROM debian:bookworm-20250520-slim AS runtime

# One package per library that build/attnd links (readelf NEEDED); their own dependencies
# (libgfortran for OpenBLAS) come with them. libgnutls30 is linked directly (TLS certificates
# are loaded by attnd, so they can be reloaded); libnghttp2-14 and libprotobuf-c1 serve
# --grpc-port. libc6 and libgcc-s1 are in the base image.
# libopenblas0-pthread is the package that provides libopenblas.so.0 through the
# libopenblas.so.0-<arch> alternative; OpenBLAS runs single-threaded inside each engine
# worker (OPENBLAS_NUM_THREADS below, read when the library loads).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libmicrohttpd12 \
        libgnutls30 \
        libjansson4 \
        libopenblas0-pthread \
        zlib1g \
        libnghttp2-14 \
        libprotobuf-c1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 attnd \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin attnd \
    && mkdir -p /models

COPY --from=build /src/build/attnd /usr/local/bin/attnd

# `attnd --healthcheck`, which Docker starts as a separate process with the same environment but
# not the container's command line, probes the port the server wrote to ATTND_PORT_FILE: the
# port can be changed with `-e ATTND_PORT=...` or with a `--port` flag alike.
ENV OPENBLAS_NUM_THREADS=1 \
    ATTND_PORT=8080 \
    ATTND_PORT_FILE=/tmp/attnd.port

# Model files are mounted here read-only and named with --model NAME=/models/FILE or
# ATTND_MODEL=NAME=/models/FILE[,NAME=/models/FILE...].
WORKDIR /models

# A numeric user, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001

EXPOSE 8080
# attnd drains on SIGTERM: readiness turns 503, in-flight requests finish (--drain-timeout-s).
STOPSIGNAL SIGTERM
# attnd itself probes /v2/health/ready, so the image needs no curl.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["attnd", "--healthcheck"]

ENTRYPOINT ["attnd", "--host", "0.0.0.0"]
CMD []
