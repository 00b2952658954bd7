# The Switchyard image: the static binary and an empty data directory,
# FROM scratch, so building it pulls nothing.
#
# This Dockerfile takes a binary built beforehand, not the source. `make
# image` builds bin/image/switchyard (CGO_ENABLED=0, -trimpath, for the
# Docker engine's OS and architecture) and runs
#   docker build -f Dockerfile bin/image
# so the build context holds only the binary and the data directory.
#
# Why not a multi-stage build with a golang stage: the machines this project
# is built and tested on, CI's included, reach no image registry, so
# `FROM golang` cannot be pulled there; and the legacy builder (Docker
# without BuildKit, which is what these machines have) builds every stage of
# a Dockerfile, so even a builder stage that is not asked for fails. Anyone
# with a Go toolchain gets this same image with `make image`; building from
# source inside Docker (which needs a registry) is in docs/compose.md.
FROM scratch
ARG VERSION=dev
LABEL org.opencontainers.image.title="switchyard" \
      org.opencontainers.image.version="${VERSION}"
COPY switchyard /switchyard
# A named volume mounted at /data starts as a copy of this directory,
# ownership included, so the unprivileged user below can write to it.
COPY --chown=65532:65532 data /data
USER 65532:65532
ENV SWITCHYARD_DATA_DIR=/data
# HTTP (web page, API), worker gRPC, node-to-node peer port, etcd peer port.
EXPOSE 8080 9090 7070 2380
# No HEALTHCHECK here: the same image runs workers, which serve no HTTP.
# docker-compose.yml checks its nodes with `/switchyard health`.
ENTRYPOINT ["/switchyard"]
CMD ["node"]
